"""A traceback that a source repeats is read once: a retry loop that logs each failure with its traceback
(``logger.warning("retrying", exc_info=True)``) may print the same one thousands of times.

When a traceback of unlabelled lines ends at a line that is not its own, the bytes from its header to its
last line are remembered, with the state its block was left in and what its text said
(:class:`blocks.Reading`). Where a line of the same source starts with those bytes again, the block is
put back in that state at once: its lines are not handed over one by one and its text is not read
again. The line after it decides, as the first time, whether the traceback ends there; if it does not
(the message goes on), the block reads on as any other and its text is read anew. What differs from one
repeat to the next is taken anew: its place, the logging call that printed it, the time before it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ml_debug.logs import blocks  # blocks.py calls back here as a block closes: names are taken at call time

if TYPE_CHECKING:
    from ml_debug.logs.blocks import Block, Reading
    from ml_debug.logs.events import Collector

MAX_REMEMBERED = 8  # distinct tracebacks remembered per source
MAX_SPAN = 64 << 10  # the longest one remembered, in bytes


@dataclass(frozen=True)
class Repeat:
    span: bytes
    """Its bytes, from the start of its header to the end of its last line."""
    lines: int
    state: Block
    """Its block after those lines."""
    reading: Reading


def rememberable(c: Collector) -> tuple[bytes, int] | None:
    """At a traceback's header (the current line): where it starts, when it may be remembered."""
    ctx = c.ctx
    assert ctx is not None
    buf, pos = c.here
    if ctx.node_prefix or len(c.repeats) >= MAX_REMEMBERED or not buf.startswith(blocks.HEADER, pos):
        return None
    return buf, pos


def _span(c: Collector, block: Block) -> bytes | None:
    """The bytes of ``block`` (closing at the current line), when it may be remembered."""
    if block.origin is None or len(c.repeats) >= MAX_REMEMBERED:
        return None
    buf, pos = c.here
    origin, start = block.origin
    if buf is not origin or not 0 < pos - start <= MAX_SPAN:
        return None
    span = buf[start:pos]
    return span if span.count(b"\n") == block.consumed else None


def wanted(c: Collector, block: Block, closer: bool) -> bool:
    """Whether ``block``, closing, will be remembered (then it is read though no event of it is kept)."""
    return closer and _span(c, block) is not None


def remember(c: Collector, block: Block, reading: Reading) -> None:
    span = _span(c, block)
    if span is not None:
        state = replace(block, text=list(block.text), exceptions=list(block.exceptions), origin=None, reading=reading,
                        time=None, nearby=None)
        c.repeats.append(Repeat(span, block.consumed, state, reading))


def replay(c: Collector, buf: bytes, pos: int, line: int, offset: int) -> Repeat | None:
    """The remembered traceback that starts at ``pos`` (a line's start, nothing open), put back as the open
    block it was after its last line; None when none does."""
    for r in c.repeats:
        if buf.startswith(r.span, pos):
            break
    else:
        return None
    c.here = (buf, pos)
    block: Block = object.__new__(blocks.Block)  # a copy of the state (copy.copy's work, a third of its time)
    block.__dict__.update(r.state.__dict__)
    block.text, block.exceptions = list(block.text), list(block.exceptions)
    block.start_line, block.start_offset, block.last_line = line, offset, line + r.lines - 1
    block.logged = blocks.logged_level(c, "")
    if c.has_room("" if block.logged is None else "handled:"):
        block.nearby = blocks.time_before(c)
    c._blocks[""] = block
    c.line = block.last_line
    return r
