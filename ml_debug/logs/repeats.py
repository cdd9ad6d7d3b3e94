"""A traceback that a source repeats is read once: a retry loop logging each failure with its traceback
(``logger.warning("retrying", exc_info=True)``) may print the same one thousands of times, its message the same
(``TimeoutError: The read operation timed out``) or not (``OSError: ... '/data/shard_00042.tar'``).

When a traceback of unlabelled lines ends at a line not its own, its *frames* (the bytes from its header to
its first exception line, with its block's state before that line) and its *ending* (the bytes from there to
its last line, with the state after it and its :class:`blocks.Reading`) are remembered. Where known frames
start a line again, the block is put back in the state after them at once, and after a known ending that
follows too (its text not read again); else what follows is read as any, and the whole read anew. The line
after the last decides, as the first time, whether it ends there (if not, it reads on as any other, read
anew). Its place, the logging call that printed it (handled or not) and the time before it are taken anew each
time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ml_debug.logs import blocks  # blocks.py calls back here as a block closes: names are taken at call time

if TYPE_CHECKING:
    from ml_debug.logs.blocks import Block, Reading
    from ml_debug.logs.events import Collector

MAX_FRAMES = 8  # distinct frames remembered per source
MAX_ENDINGS = 4  # endings remembered per frames
MAX_SPAN = 64 << 10  # the longest frames or ending remembered, in bytes


@dataclass(frozen=True)
class Ending:
    span: bytes  # its bytes, from its exception line to its last line
    lines: int  # the traceback's lines, its frames' with them
    state: Block  # the traceback's block after its last line, with its reading


@dataclass
class Frames:
    span: bytes  # its bytes, from the header to its exception line
    state: Block  # its block before its exception line
    endings: list[Ending] = field(default_factory=list)


def rememberable(c: Collector) -> tuple[bytes, int] | None:
    """At a traceback's header (the current line): where it starts, when it may be remembered."""
    ctx = c.ctx
    assert ctx is not None
    buf, pos = c.here
    if ctx.node_prefix or len(c.repeats) >= MAX_FRAMES or not buf.startswith(blocks.HEADER, pos):
        return None
    return buf, pos


def _parts(c: Collector, block: Block) -> tuple[Frames | Block, bytes, bytes] | None:
    """``block``, closing at the current line: its known frames (or its state before its exception line, when
    they are new), its frames' bytes and its ending's; None when it is not to be remembered (not in the scanned
    block, a line not its own, too long, no room)."""
    if block.origin is None or block.before_exception is None:
        return None
    origin, start = block.origin
    at, before = block.before_exception
    end = c.here[1]
    if c.here[0] is not origin or not start < at < end or end - start > 2 * MAX_SPAN:
        return None
    ending = origin[at:end]
    if isinstance(before, Frames):
        if len(before.endings) >= MAX_ENDINGS or ending.count(b"\n") != block.consumed - before.state.consumed:
            return None
        return before, before.span, ending
    frames = origin[start:at]
    if len(c.repeats) >= MAX_FRAMES or frames.count(b"\n") != before.consumed or \
            frames.count(b"\n") + ending.count(b"\n") != block.consumed:
        return None
    return before, frames, ending


def wanted(c: Collector, block: Block, closer: bool) -> bool:
    """Whether ``block``, closing, will be remembered (then it is read though no event of it is kept)."""
    return closer and _parts(c, block) is not None


def remember(c: Collector, block: Block, reading: Reading | None) -> None:
    """``block``, closing at the current line (not its own): its frames, and its ending with ``reading``."""
    parts = _parts(c, block)
    if parts is None or reading is None:
        return
    known, frames, ending = parts
    if not isinstance(known, Frames):  # new frames: the state before its exception line
        known.origin, known.before_exception, known.time, known.nearby = None, None, None, None
        known = Frames(frames, known)
        c.repeats.append(known)
    if any(e.span == ending for e in known.endings):
        return
    state = block.copy()
    state.origin, state.before_exception, state.reading, state.time, state.nearby = None, None, reading, None, None
    known.endings.append(Ending(ending, block.consumed, state))


def replay(c: Collector, buf: bytes, pos: int, line: int, offset: int) -> int:
    """The remembered traceback (or frames) that starts at ``pos`` (a line's start, nothing open), put back as
    the open block it was after its last line: the number of bytes taken (0 when none starts there)."""
    for known in c.repeats:
        if buf.startswith(known.span, pos):
            break
    else:
        return 0
    at = pos + len(known.span)
    ending = next((e for e in known.endings if buf.startswith(e.span, at)), None)
    c.here = (buf, pos)
    logged = blocks.logged_level(c, "")
    stream = "" if logged is None else "handled:"
    if ending is not None and not c.has_room(stream) and c.closes(buf, at + len(ending.span), ending.state):
        # no event of it can be kept, and the line after it ends it: it is only counted, as close_block would
        c.full(stream)
        reading = ending.state.reading
        assert reading is not None  # remember() keeps an ending with its reading
        for name in reading.launchers:
            c._mark(name)
        c.line = line + ending.lines - 1
        return len(known.span) + len(ending.span)
    if ending is not None:
        block = ending.state.copy()
        lines, taken = ending.lines, len(known.span) + len(ending.span)
    else:  # its frames only: its ending, read as any, may be remembered as it closes
        block = known.state.copy()
        block.origin, block.before_exception = (buf, pos), (at, known)
        lines, taken = known.state.consumed, len(known.span)
    block.start_line, block.start_offset, block.last_line = line, offset, line + lines - 1
    block.marked = len(block.text)  # the first one's reading took its launchers' marks
    block.logged = logged
    if c.has_room(stream):
        block.nearby = blocks.time_before(c)
    c._blocks[""] = block
    c.line = block.last_line
    return taken
