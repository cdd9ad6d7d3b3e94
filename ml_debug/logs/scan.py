"""One streaming pass over each source; only the lines that can matter reach Python code.

Each 1 MiB block gets one prefilter pass (engine.py: every word of the catalogue and of failure lines in one
Hyperscan database); only the lines holding one are decoded and fed to the collector, plus every line while
a traceback (or torchrun's failure summary) is open. Memory stays bounded: one block, the events, the NCCL
tallies.
"""

from __future__ import annotations

import io
import json
import lzma
import os
import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from ml_debug.core.inputs import open_regular
from ml_debug.logs.blocks import HEADER
from ml_debug.logs.catalogue import NCCL_LINES_PER_SOURCE
from ml_debug.logs.container import Unwrapped
from ml_debug.logs.engine import prefilter
from ml_debug.logs.events import Collector, SourceContext
from ml_debug.logs.repair import MEND_LIMIT, mend, sniff
from ml_debug.logs.repeats import replay
from ml_debug.logs.sources import OPENERS, Source

BLOCK = 1 << 20
MAX_LINE = 1 << 20  # a "line" longer than this is cut (a binary file, a progress bar without newlines)
TAIL_BYTES = 64 << 10
SAMPLE_BYTES = 4 << 10  # the lines at the start of each block whose labels say who writes (ranks seen)
WINDOW = 64 << 10  # one prefilter pass while a source's NCCL lines are still read in full (_window)
MAX_SOURCE_BYTES = 64 << 30
"""The most one source is read (decompressed): a stream that never ends (`yes | mldebug logs -`) or a file
that grows as fast as it is read stops here, and the source says it was cut."""
CONTEXT_BYTES = 16 << 10
"""The end of a block kept before the next one: what the lines above a line say (the logging record before a
traceback, the time before it, Open MPI's process name, a summary's entry) is found across blocks too."""


class Decompressed:
    """A compressed file's data up to where it is damaged (a copy cut short, a job killed while compressing);
    ``src.cut`` says why the rest is missing. ``read1``, not ``read``, which drops what it decompressed in a
    call that then meets the damage."""

    def __init__(self, f: io.BufferedIOBase, src: Source) -> None:
        self._f = f
        self._src = src
        self._pos = 0

    def read(self, size: int = -1) -> bytes:
        parts: list[bytes] = []
        want = size if size >= 0 else sys.maxsize
        got = 0
        while got < want and self._src.cut is None:
            try:
                piece = self._f.read1(min(want - got, BLOCK))
            except (EOFError, OSError, zlib.error, lzma.LZMAError) as e:
                self._src.cut = (f"truncated or damaged {self._src.codec} file: only its first "
                                 f"{self._pos + got} B (decompressed) were read ({type(e).__name__}: {e})")
                break
            if not piece:
                break
            parts.append(piece)
            got += len(piece)
        self._pos += got
        return b"".join(parts)


class Capped:
    """At most MAX_SOURCE_BYTES of a stream; past that ``src.cut`` says how much was read."""

    def __init__(self, f: IO[bytes], src: Source, limit: int = MAX_SOURCE_BYTES) -> None:
        self._f, self._src, self._left, self._limit = f, src, limit, limit

    def read(self, size: int = -1) -> bytes:
        if self._left <= 0:
            if self._f.read(1):
                self._src.cut = (f"only its first {self._limit >> 30} GiB were read, the most one source may hold "
                                 "(MAX_SOURCE_BYTES)")
            return b""
        if size < 0:  # everything: in blocks (one read of the whole budget would allocate it)
            return b"".join(iter(lambda: self.read(BLOCK), b""))
        data = self._f.read(min(size, self._left))
        self._left -= len(data)
        return data

    def fileno(self) -> int:
        return self._f.fileno()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)


def _open_regular(path: str) -> IO[bytes]:
    """A log file opened without waiting (open_regular: a FIFO put in its place is refused, not waited on)."""
    fd, _ = open_regular(path)
    return open(fd, "rb", buffering=0)  # whole blocks are read: no second buffer


@contextmanager
def opened(src: Source) -> Iterator[IO[bytes]]:
    """The source as a binary stream (decompressed, up to any damage; standard input for ``-``), at most
    MAX_SOURCE_BYTES of it."""
    if src.stdin:
        yield Capped(_text(sys.stdin.buffer, src), src)  # type: ignore[misc]
        return
    if src.codec:
        src.cut = None
        with _open_regular(src.file or src.path) as raw, OPENERS[src.codec](raw) as f:
            yield Capped(_text(Decompressed(f, src), src), src)  # type: ignore[arg-type, misc]
        return
    with _open_regular(src.file or src.path) as f:
        yield Capped(_text(f, src), src)  # type: ignore[misc]


def _text(f: IO[bytes], src: Source) -> IO[bytes]:
    """A text source's lines as the program wrote them: unwrapped from a container runtime's records."""
    return Unwrapped(f, src) if src.labelled else f  # type: ignore[return-value]


def _chunks(src: Source, f: IO[bytes], collector: Collector) -> Iterator[tuple[bytes, int]]:
    """The source's data in blocks, each with the bytes of the source it stands for; mended first (repair.py) when
    its first bytes show a pasted log's damage (the mended text is read, and its offsets are the mended text's)."""
    first = f.read(BLOCK)
    if not first:
        return
    ctx = collector.ctx
    assert ctx is not None
    if src.container:
        collector.notes.setdefault(ctx.index, []).append(
            f"a container runtime's log ({src.container}): each record's text read, with its time")
    damage = sniff(first)
    ctx.node_prefix = damage.node_prefix
    if damage.node_prefix:
        collector.node_prefixed.add(ctx.index)
        collector.notes.setdefault(ctx.index, []).append("lines start with their node's name (pdsh): read as labels")
    if damage.whole:
        data = first + f.read(MEND_LIMIT)
        more = f.read(1)
        if not more:
            mended = mend(data, damage)
            collector.notes.setdefault(ctx.index, []).extend(damage.notes)
            for i in range(0, len(mended), BLOCK):
                yield mended[i:i + BLOCK], 0 if i else len(data)
            return
        collector.notes.setdefault(ctx.index, []).append(
            f"looks pasted (damaged) but is over {MEND_LIMIT >> 20} MiB: read as it is")
        first = data + more
    yield first, len(first)
    for chunk in iter(lambda: f.read(BLOCK), b""):
        yield chunk, len(chunk)


def scan_lines(src: Source, collector: Collector) -> tuple[int, int, bytes]:
    """Feed the lines of a text source that can matter; (bytes read, lines, last line)."""
    total = lines = 0
    carry = b""
    last = b""
    at = 0  # the file offset where `carry` starts
    goes_on = False  # a piece of the line `carry` ends was read (a line over MAX_LINE)
    before = b""  # the last lines of the block read before (CONTEXT_BYTES)
    with opened(src) as f:
        for chunk, size in _chunks(src, f, collector):
            total += size
            data = carry + chunk if carry else chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0 and len(data) < MAX_LINE:
                carry = data
                continue
            goes_on = cut == 0
            if goes_on:  # no newline in a whole MiB: cut it here, with a newline that is not the file's
                data += b"\n"
                cut = len(data)
            carry = data[cut:]
            lines, last = _scan_block(before + data, len(before), len(before) + cut, lines, at - len(before),
                                      collector)
            before = b"" if goes_on else _context(data, cut)
            at += cut - goes_on
            lines -= goes_on  # the line goes on: its next piece has its number
    lines += goes_on and not carry  # a cut line that ends the file, without a newline
    if carry:
        lines, last = _scan_block(before + carry + b"\n", len(before), len(before) + len(carry) + 1, lines,
                                  at - len(before), collector)
        if collector.open and collector.ctx is not None:
            collector.notes.setdefault(collector.ctx.index, []).append(
                "cut short: the last line has no newline and ends inside a traceback or failure summary")
    return total, lines, last


def _context(data: bytes, cut: int) -> bytes:
    """The whole lines at the end of ``data[:cut]`` (which starts and ends a line), at most CONTEXT_BYTES."""
    if cut <= CONTEXT_BYTES:
        return data[:cut]
    return data[data.find(b"\n", cut - CONTEXT_BYTES, cut - 1) + 1:cut]


def _scan_block(block: bytes, start: int, n: int, lines: int, base: int, collector: Collector) -> tuple[int, bytes]:
    """Feed the lines of ``block[start:n]`` (which ends with a newline; ``block[:start]``, the lines before it,
    already read, at file offset ``base``); (lines so far, its last line)."""
    find, count = block.find, block.count
    counted = pos = start
    if lines == 0 and base == 0 and start == 0:
        collector.starts(block[:n])
    # while a source's NCCL lines are still read in full, the block is taken in windows: once they are read,
    # the rest is scanned without them (catalogue.NCCL_LINES_PER_SOURCE)
    nccl = collector.nccl_lines < NCCL_LINES_PER_SOURCE
    win_end = _window(block, start, n, nccl)
    weak = collector.ctx is not None and not collector.ctx.node_prefix  # pdsh's host names may say "ERROR"
    cands = prefilter(nccl).candidates(block, win_end, start, weak)
    if collector.ctx is not None and collector.ctx.labelled:
        _sample(block, start, min(n, start + SAMPLE_BYTES), collector)
    ci = 0
    nc = len(cands)
    feed = collector.feed
    open_blocks = collector._blocks  # while any is open, every line is handed over (one dict per source)
    while pos < n:
        if nccl and collector.nccl_lines >= NCCL_LINES_PER_SOURCE:
            nccl = False
            win_end = n
            cands = prefilter(False).candidates(block, n, pos, weak)
            ci, nc = 0, len(cands)
        if not open_blocks:
            while ci < nc and cands[ci] < pos:
                ci += 1
            if ci == nc:
                if win_end >= n:
                    break
                start = max(pos, win_end)
                win_end = _window(block, start, n, nccl)
                cands = prefilter(nccl).candidates(block, win_end, start, weak)
                ci, nc = 0, len(cands)
                continue
            pos = cands[ci]
            ci += 1
        if block.startswith(b"  ", pos) and collector.in_frames():
            # a run of indented lines in a traceback's frames: taken in one call, not line by line
            stop = pos
            while stop < n and block.startswith(b"  ", stop):
                stop = find(b"\n", stop, n) + 1
            run = block[pos:stop]
            if b"\r" not in run and b"\x1b" not in run:
                lines += count(b"\n", counted, pos) + run.count(b"\n")
                counted = pos = stop
                collector.frames(run, lines)
                continue
        if not open_blocks and collector.repeats and block.startswith(HEADER, pos):
            at = lines + count(b"\n", counted, pos) + 1
            taken = replay(collector, block, pos, at, base + pos)
            if taken:  # a traceback (or its frames) this source printed before: put back (repeats.py)
                lines = collector.line
                counted = pos = pos + taken
                continue
        quiet = False
        if open_blocks and pos < win_end:  # a line handed over because a block is open: is it a candidate?
            while ci < nc and cands[ci] < pos:
                ci += 1
            quiet = ci == nc or cands[ci] != pos
        end = find(b"\n", pos, n)
        lines += count(b"\n", counted, pos) + 1
        counted = end + 1
        collector.here = (block, pos)
        if not (open_blocks and collector.feed_open(block[pos:end], lines, base + pos, quiet)):
            feed(block[pos:end], lines, base + pos, quiet)
        pos = end + 1
    lines += count(b"\n", counted, n)
    last_start = block.rfind(b"\n", 0, n - 1) + 1
    return lines, block[last_start:n - 1]


def _window(block: bytes, start: int, n: int, nccl: bool) -> int:
    """The end of the window of ``block[:n]`` from ``start`` that one prefilter pass covers: the whole rest, or,
    while NCCL lines are read in full, about WINDOW bytes (to a line's end)."""
    if not nccl or start + WINDOW >= n:
        return n
    nl = block.find(b"\n", start + WINDOW, n)
    return n if nl < 0 else nl + 1


def _sample(block: bytes, start: int, n: int, collector: Collector) -> None:
    """Hand the whole lines of ``block[start:n]`` to the collector's label sampling (a few dozen per MiB)."""
    lines = block[start:n].split(b"\n")
    for raw in lines[:-1] if n < len(block) else lines:
        if raw:
            collector.sample(raw)


def metrics_tail(src: Source, collector: Collector) -> tuple[int, dict[str, Any] | None]:
    """(size, the last progress record) of an mldebug train metrics file: only its end is read."""
    with opened(src) as f:
        if not src.codec and not src.stdin:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read()
        else:
            data = b""
            size = 0
            for chunk in iter(lambda: f.read(BLOCK), b""):
                size += len(chunk)
                data = (data + chunk)[-TAIL_BYTES:]
    for line in reversed(data.splitlines()):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        got = collector.metrics_line(rec)
        if got is not None and got.get("step") is not None:
            return size, got
    return size, None


def feed_source(src: Source, index: int, collector: Collector) -> dict[str, Any]:
    """Read one source into the collector; what was read (bytes, lines, last line, progress)."""
    ctx = SourceContext(index=index, path=src.path, who=src.who, day=src.day, labelled=src.labelled)
    collector.begin(ctx)
    try:
        if src.shape == "error-file":
            with opened(src) as f:
                data = f.read(16 << 20)  # the whole of a small source
            collector.error_file(data)
            return {"bytes": len(data), "lines": data.count(b"\n")}
        if src.shape == "train-metrics":
            size, progress = metrics_tail(src, collector)
            return {"bytes": size, "lines": 0, "progress": progress}
        total, lines, last = scan_lines(src, collector)
        return {"bytes": total, "lines": lines, "last_line": last.decode("utf-8", "replace")[:300]}
    finally:
        collector.end()
