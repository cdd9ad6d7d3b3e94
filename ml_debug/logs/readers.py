"""Every source read into one collector: in this process, or shared among reader processes.

Reading is CPU work and sources are independent, so a job's files are cut into shares of neighbouring
sources, read by reader processes (one per CPU, at most :data:`MAX_JOBS`) into collectors of their own that
this process takes in, in source order (``Collector.absorb``): the report is the one a single reader would
write. A directory's files stay in one share because a reader cannot know the rank of an NCCL process (its
``comm ... rank R`` line) from another share's files. Small inputs (below :data:`PARALLEL_BYTES`, where
starting readers costs more than it saves) and standard input are read here.

A reader is ``python -c`` with the working directory taken off the import path (``-m`` would put it first:
a job user's directory, when root reads their logs, could shadow mldebug). It dies with this process,
ignores Ctrl-C (this process decides), and one that fails (killed, out of memory) loses nothing: its shares
are read again here.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ml_debug.core import lifecycle, testhooks
from ml_debug.core.gcpause import gc_paused
from ml_debug.dist.limits import cpu_cores
from ml_debug.logs.events import Collector
from ml_debug.logs.result import SourceInfo
from ml_debug.logs.scan import feed_source
from ml_debug.logs.sources import Expanded, Source

MAX_JOBS = 16
"""Reader processes at most: what they find is taken in by this process alone (16k files: 1.1 s of CPU
here against 15 s in the readers), which more readers do not shorten."""
PARALLEL_BYTES = 64 << 20
"""Below this much text (or with fewer sources than two shares) every source is read in this process."""
TEXT_PER_BYTE = {"gzip": 8, "zstd": 8, "xz": 20, "bzip2": 15, "lz4": 4}
"""About how much text a byte of each compression holds in a job's logs, at least (benchmarks/bench_logs.py's
mixes: gzip 10-52, zstd 10-62, xz 30-130, bzip2 21-100, lz4 5-28): a source's share of the reading is its text's."""
SHARES_PER_JOB = 4
"""Shares per reader: progress moves in steps of one share, and a share of big files holds no one up long."""
READER = [sys.executable, "-c", "import sys; del sys.path[0]; from ml_debug.logs.readers import serve; serve()"]

OnSource = Callable[[int, int], None]


@dataclass
class Read:
    """What reading one source gave, beside what went into the collector."""

    info: SourceInfo
    metrics: dict[str, Any] | None = None
    skipped: dict[str, str] | None = None


Share = tuple[Collector, list[Read]]
"""What a reader sends back for one share: its collector and each source's Read (a damaged end said in it)."""


def read_source(src: Source, index: int, collector: Collector) -> Read:
    """One source into ``collector``; an unreadable one (or the damaged end of one) is said, not raised."""
    info = SourceInfo(path=src.path, shape=src.shape, who=src.who)
    before = len(collector.events)
    got = Read(info)
    try:
        done = feed_source(src, index, collector)
    except OSError as e:
        info.error = f"{type(e).__name__}: {e}"
    else:
        info.bytes, info.lines = int(done.get("bytes", 0)), int(done.get("lines", 0))
        got.metrics = done.get("progress") or None
        if done.get("last_line"):
            info.note = f"last line: {done['last_line']}"
        if src.cut:  # read up to its damaged end: the failure may be in what is missing
            info.error = src.cut
    if info.error:
        got.skipped = {"path": src.path, "reason": info.error}
    info.events = len(collector.events) - before
    return got


def default_jobs() -> int:
    """One reader per CPU this process may run on, at most MAX_JOBS."""
    return min(cpu_cores(), MAX_JOBS)


def read_all(exp: Expanded, on_source: OnSource | None = None, *,
             jobs: int | None = None) -> tuple[Collector, list[Read]]:
    """Every source of ``exp`` read, in source order, by ``jobs`` readers (None: :func:`readers_for`; 1: here)."""
    if jobs is None:
        jobs = readers_for(exp.sources)
    shares = _shares(exp.sources, jobs * SHARES_PER_JOB) if jobs > 1 else []
    if len(shares) < 2 or any(s.stdin for s in exp.sources):
        return _read_here(exp.sources, range(len(exp.sources)), on_source)
    with gc_paused():  # the readers' findings arrive as many small objects at once (16k files: 0.52 -> 0.24 s)
        return _read_shared(exp.sources, shares, min(jobs, len(shares)), on_source)


def _read_here(sources: list[Source], share: range, on_source: OnSource | None) -> Share:
    collector = Collector()
    reads = []
    for i in share:
        reads.append(read_source(sources[i], i, collector))
        if on_source is not None:
            on_source(i, len(sources))
    return collector, reads


def readers_for(sources: list[Source]) -> int:
    """The readers :func:`read_all` starts by default: one per CPU for PARALLEL_BYTES of text or more, else none."""
    return default_jobs() if sum(text_bytes(s) for s in sources) >= PARALLEL_BYTES else 1


def text_bytes(src: Source) -> int:
    """About how much text reading ``src`` gives (a compressed file's, by TEXT_PER_BYTE); at least 1."""
    return max(1, src.size * TEXT_PER_BYTE.get(src.codec, 1))


def _shares(sources: list[Source], want: int) -> list[range]:
    """The sources cut into about ``want`` runs of neighbours of similar text size. A cut waits for the next
    directory (a rank's stdout and stderr, one process's lines, stay in one share) up to twice a share's
    size: a flat directory of many files is still shared out."""
    step = sum(text_bytes(s) for s in sources) / max(1, want)
    out: list[range] = []
    start, acc = 0, 0
    for i, src in enumerate(sources):
        acc += text_bytes(src)
        due = step * (len(out) + 1)
        if i + 1 == len(sources) or (acc >= due and (acc >= due + step or os.path.dirname(sources[i + 1].path)
                                                     != os.path.dirname(src.path))):
            out.append(range(start, i + 1))
            start = i + 1
    return out


# ---------------------------------------------------------------------------------------- this process

def _read_shared(sources: list[Source], shares: list[range], jobs: int,
                 on_source: OnSource | None) -> tuple[Collector, list[Read]]:
    done: dict[int, Share] = {}
    got: queue.Queue[tuple[int, Share] | None] = queue.Queue()
    readers: list[_Reader] = []
    try:
        for k in range(jobs):
            work = [(n, shares[n].start, sources[shares[n].start:shares[n].stop]) for n in range(k, len(shares), jobs)]
            # a Ctrl-C while a reader starts is raised once it is in `readers`, which the finally stops
            with lifecycle.held_signals() as held:
                try:
                    readers.append(_Reader(held.popen, work, got))
                except OSError:  # no more processes: its shares are read here below
                    break
        running = len(readers)
        while running:
            try:
                item = got.get(timeout=0.5)  # a timeout: Ctrl-C is seen while waiting
            except queue.Empty:
                continue
            if item is None:  # a reader finished (or failed: what it did not send is read below)
                running -= 1
                continue
            n, share = item
            done[n] = share
            if on_source is not None:
                for i in shares[n]:
                    on_source(i, len(sources))
    finally:
        for r in readers:
            r.stop()
    merged = Collector()
    reads: list[Read] = []
    for n, share_range in enumerate(shares):  # a share no reader sent back is read here
        collector, share_reads = done.pop(n) if n in done else _read_here(sources, share_range, on_source)
        reads.extend(take_in(merged, collector, share_reads))
    return merged, reads


def take_in(merged: Collector, share: Collector, reads: list[Read]) -> list[Read]:
    """A share's collector taken into ``merged`` (after the shares before it); its sources' event counts
    are those ``merged`` kept, as if one collector had read them."""
    kept = merged.absorb(share)
    for r in reads:  # a share's events are in the order of its sources
        r.info.events = min(r.info.events, kept)
        kept -= r.info.events
    return reads


class _Reader:
    """One reader process, fed its shares at once; a thread puts each share it sends back on ``out``,
    then None."""

    def __init__(self, popen: Callable[..., subprocess.Popen[bytes]], work: list[tuple[int, int, list[Source]]],
                 out: queue.Queue[tuple[int, Share] | None]) -> None:
        # its errors are not kept: a share it fails on is read again here, where an error shows as it would
        self.proc = popen(READER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          env={**os.environ, **lifecycle.child_env(signal.SIGKILL)})
        self._thread = threading.Thread(target=self._relay, args=(pickle.dumps(work), out), daemon=True)
        self._thread.start()

    def _relay(self, payload: bytes, out: queue.Queue[tuple[int, Share] | None]) -> None:
        try:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            with self.proc.stdin:
                self.proc.stdin.write(payload)
            while True:  # one pickle per share, up to the end of the stream (EOFError) or a cut one
                out.put(pickle.load(self.proc.stdout))
        except (OSError, EOFError, pickle.UnpicklingError):
            pass  # the reader ended, or failed: its shares not sent are read in the first process
        finally:
            out.put(None)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._thread.join()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


# ---------------------------------------------------------------------------------------- a reader

def serve() -> None:
    """A reader process: its shares (pickled, on standard input) read and sent back one by one."""
    lifecycle.adopt_parent_tie()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    work: list[tuple[int, int, list[Source]]] = pickle.load(sys.stdin.buffer)
    out = sys.stdout.buffer
    for n, first, sources in work:
        testhooks.call(testhooks.LOGS_READER_SHARE, share=n)
        collector = Collector()
        reads = [read_source(src, first + k, collector) for k, src in enumerate(sources)]
        pickle.dump((n, (collector.portable(), reads)), out, protocol=pickle.HIGHEST_PROTOCOL)
        out.flush()
