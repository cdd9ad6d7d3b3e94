"""A traceback that a source repeats is read once: a retry loop that logs each failure with its traceback
(``logger.warning("retrying", exc_info=True)``) may print the same one thousands of times.

When a traceback of unlabelled lines ends at a line that is not its own, the bytes from its header to its
last line are remembered, with the state its block was left in and what its text said
(:class:`blocks.Reading`); so are its frames (up to its exception line), with the state before that line, for a
repeat whose message differs (``OSError: ... '/data/shard_00042.tar'``): then its exception line and what follows
are read as any, and its text is read anew. Where a line of the same source starts with those bytes again, the block is
put back in that state at once: its lines are not handed over one by one and its text is not read
again. The line after it decides, as the first time, whether the traceback ends there; if it does not
(the message goes on), the block reads on as any other and its text is read anew. What differs from one
repeat to the next is taken anew: its place, the logging call that printed it, the time before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ml_debug.logs import blocks  # blocks.py calls back here as a block closes: names are taken at call time

if TYPE_CHECKING:
    from ml_debug.logs.blocks import Block, Reading
    from ml_debug.logs.events import Collector

MAX_REMEMBERED = 16  # tracebacks, and their frames, remembered per source
MAX_SPAN = 64 << 10  # the longest one remembered, in bytes


@dataclass(frozen=True)
class Repeat:
    span: bytes
    """Its bytes, from the start of its header to the end of its last line (or of its frames)."""
    lines: int
    state: Block
    """Its block after those lines."""


def rememberable(c: Collector) -> tuple[bytes, int] | None:
    """At a traceback's header (the current line): where it starts, when it may be remembered."""
    ctx = c.ctx
    assert ctx is not None
    buf, pos = c.here
    if ctx.node_prefix or len(c.repeats) >= MAX_REMEMBERED or not buf.startswith(blocks.HEADER, pos):
        return None
    return buf, pos


def _span(c: Collector, block: Block, end: int) -> bytes | None:
    """The bytes of ``block`` up to ``end`` (where its next line starts), when they may be remembered: in the
    scanned block, every line its own, not remembered yet."""
    if block.origin is None or len(c.repeats) >= MAX_REMEMBERED:
        return None
    origin, start = block.origin
    if c.here[0] is not origin or not 0 < end - start <= MAX_SPAN:
        return None
    span = origin[start:end]
    if any(r.span == span for r in c.repeats):
        return None
    return span


def wanted(c: Collector, block: Block, closer: bool) -> bool:
    """Whether ``block``, closing, will be remembered (then it is read though no event of it is kept)."""
    span = _span(c, block, c.here[1]) if closer else None
    return span is not None and span.count(b"\n") == block.consumed


def remember(c: Collector, block: Block, reading: Reading | None) -> None:
    """``block``, closing at the current line (not its own): its bytes, its state and ``reading`` (when read),
    then its frames and the state before its exception line."""
    span = _span(c, block, c.here[1]) if reading is not None else None
    if span is not None and span.count(b"\n") == block.consumed:
        state = block.copy()
        state.origin, state.before_exception, state.reading, state.time, state.nearby = None, None, reading, None, None
        c.repeats.append(Repeat(span, block.consumed, state))
    if block.before_exception is not None:
        at, state = block.before_exception
        span = _span(c, block, at)
        if span is not None and span.count(b"\n") == state.consumed:
            state.origin, state.before_exception = None, None
            c.repeats.append(Repeat(span, state.consumed, state))


def replay(c: Collector, buf: bytes, pos: int, line: int, offset: int) -> Repeat | None:
    """The longest remembered traceback (or frames) that starts at ``pos`` (a line's start, nothing open), put
    back as the open block it was after its last line; None when none does."""
    found = None
    for r in c.repeats:
        if (found is None or len(r.span) > len(found.span)) and buf.startswith(r.span, pos):
            found = r
    if found is None:
        return None
    c.here = (buf, pos)
    block = found.state.copy()
    block.start_line, block.start_offset, block.last_line = line, offset, line + found.lines - 1
    block.marked = len(block.text)  # the first one's reading took its launchers' marks
    if block.stage == "frames":  # its frames only: the whole may be remembered as it closes (its frames are)
        block.origin, block.before_exception = (buf, pos), (pos + len(found.span), found.state)
    block.logged = blocks.logged_level(c, "")
    if c.has_room("" if block.logged is None else "handled:"):
        block.nearby = blocks.time_before(c)
    c._blocks[""] = block
    c.line = block.last_line
    return found
