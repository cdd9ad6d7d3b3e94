"""Progress files: how far a job is and how fast it goes, from files it writes anyway.

The rule (``--progress-file PATTERN``, repeatable):

- PATTERN is a glob on each node. ``{rank}`` stands for each rank's global rank and
  ``{local_rank}`` for its local rank, so ``run/metrics/rank-{rank}.jsonl`` (the layout of
  ``mldebug train --metrics-dir run/metrics``) gives every rank its own file. Any other ``{...}``
  is refused when the option is parsed: a misspelt placeholder would match no file, silently.
- Without ``{rank}``, every file the glob finds is read; a file whose name holds ``rank-N``,
  ``rank_N`` or ``rankN`` belongs to rank N, any other file to the node.
- Progress is the ``step`` field of the file's last complete JSON line; a file whose lines are not
  JSON with a ``step`` (a plain log) progresses by the number of lines added since mldebug started
  reading it.
- The rate is the progress made over the last :data:`WINDOW_S` seconds (or over the time seen so
  far, when shorter), per second; a file that cannot be read has none (its ``error`` says why).
- A pattern that names no file (for a rank, or at all) is reported as ``not found``, from the glob
  that looked for it: no extra system call.

Files are opened as files a job's owner controls (:func:`ml_debug.core.safefs.open_found`): never
through a symbolic link at the last component, never a FIFO or a device, so a root agent cannot be
made to read someone else's file or block on a pipe.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from ml_debug.sampling.sample import ProgressFile

WINDOW_S = 10.0
"""Seconds of history a rate is measured over."""

TAIL_BYTES = 64 * 1024
"""How much of a file is read to find its last step the first time (a log may be gigabytes)."""

MAX_READ_BYTES = 4 * 1024 * 1024
"""At most this much new text is read per file and sample; beyond it only whole lines are counted."""

RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)

NOT_FOUND = "not found"
"""The error of a file a pattern names that is not there."""


class FileSource(NamedTuple):
    """Why a file is read: the pattern that names it and the rank it belongs to (None: the node's)."""

    pattern: str
    rank: int | None


def rank_of_file(path: str) -> int | None:
    """The rank a file's name says it belongs to (``rank-3.jsonl`` -> 3), else None."""
    m = RANK_IN_NAME.search(os.path.basename(path))
    return int(m.group(1)) if m else None


def last_step(text: bytes) -> int | None:
    """The ``step`` of the last complete JSON line that has one (lines are scanned from the end)."""
    lines = text.split(b"\n")
    if not text.endswith(b"\n"):
        lines = lines[:-1]  # the writer may be half-way through the last line
    for raw in reversed(lines):
        raw = raw.strip()
        if not raw.startswith(b"{"):
            continue
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        step = doc.get("step") if isinstance(doc, dict) else None
        if isinstance(step, int) and not isinstance(step, bool):
            return step
    return None


@dataclass
class FileProgress:
    """What is known about one progress file."""

    path: str
    offset: int = 0  # bytes read so far
    inode: tuple[int, int] | None = None
    lines: int = 0  # complete lines added since the first read
    step: int | None = None
    mtime: float | None = None
    error: str | None = None
    history: deque[tuple[float, float]] = field(default_factory=deque)

    @property
    def kind(self) -> str:
        return "step" if self.step is not None else "lines"

    @property
    def value(self) -> float:
        return float(self.step) if self.step is not None else float(self.lines)

    def rate(self) -> float | None:
        """Progress per second over the kept history; None until two readings span some time."""
        if len(self.history) < 2:
            return None
        (t0, v0), (t1, v1) = self.history[0], self.history[-1]
        if t1 - t0 <= 0:
            return None
        return max(0.0, (v1 - v0) / (t1 - t0))

    def as_sample(self, now_wall: float, source: FileSource, *, has_rank: bool = True) -> ProgressFile:
        """What a node sample says of this file (``has_rank``: the wire form names its rank)."""
        rate = None if self.error else self.rate()  # a file not read shows no progress, not a stop
        return ProgressFile(path=self.path, kind=self.kind, step=self.step, lines=self.lines,
                            rate=None if rate is None else round(rate, 3),
                            age_s=None if self.mtime is None else round(max(0.0, now_wall - self.mtime), 1),
                            error=self.error, pattern=source.pattern, rank=source.rank, has_rank=has_rank)


class ProgressReader:
    """Reads progress files incrementally; one instance per agent."""

    def __init__(self, patterns: Iterable[str], window_s: float = WINDOW_S) -> None:
        self.patterns = [os.path.expanduser(p) for p in patterns]
        self.window_s = window_s
        self.files: dict[str, FileProgress] = {}

    def paths_for(self, ranks: Iterable[tuple[int | None, int | None]]
                  ) -> tuple[dict[str, FileSource], dict[str, FileSource]]:
        """(every file the patterns name now, every file they name that is not there: a rank's, or a
        whole pattern that matches nothing), each path -> its :class:`FileSource`."""
        found: dict[str, FileSource] = {}
        missing: dict[str, FileSource] = {}
        ranks = list(ranks)
        for pattern in self.patterns:
            if "{rank}" in pattern or "{local_rank}" in pattern:
                for rank, local in ranks:
                    if rank is None or ("{local_rank}" in pattern and local is None):
                        continue
                    concrete = pattern.replace("{rank}", str(rank)).replace("{local_rank}", str(local))
                    self._glob(concrete, FileSource(pattern, rank), found, missing)
            else:
                self._glob(pattern, FileSource(pattern, None), found, missing)
        return found, missing

    @staticmethod
    def _glob(pattern: str, source: FileSource, found: dict[str, FileSource], missing: dict[str, FileSource]) -> None:
        paths = sorted(glob.glob(pattern))
        if not paths:
            missing.setdefault(pattern, source)
        for path in paths:
            rank = source.rank if source.rank is not None else rank_of_file(path)
            found.setdefault(path, FileSource(source.pattern, rank))

    def read(self, path: str, now: float | None = None) -> FileProgress:
        """Bring one file up to date (new lines, last step, rate history)."""
        now = time.monotonic() if now is None else now
        fp = self.files.get(path)
        if fp is None:
            fp = self.files[path] = FileProgress(path=path)
        kind = fp.kind
        try:
            self._update(fp)
            fp.error = None
        except OSError as e:
            fp.error = e.strerror or str(e)
        except Exception as e:  # a refusal from safefs (a symlink, a FIFO): said, not fatal
            fp.error = str(e)
        if fp.kind != kind:  # the first step line of a file counted by lines until now
            fp.history.clear()
        fp.history.append((now, fp.value))
        while len(fp.history) > 2 and now - fp.history[1][0] >= self.window_s:
            fp.history.popleft()
        return fp

    def _update(self, fp: FileProgress) -> None:
        from ml_debug.core.safefs import open_found, opened

        fd, st = open_found(os.path.abspath(fp.path), fp.path)
        with opened(fd):
            ident = (st.st_dev, st.st_ino)
            if fp.inode != ident or st.st_size < fp.offset:  # new, replaced or truncated: start again
                first = fp.inode is None
                fp.inode, fp.lines = ident, 0
                fp.offset = max(0, st.st_size - TAIL_BYTES)
                if not first:
                    fp.history.clear()
                os.lseek(fd, fp.offset, os.SEEK_SET)
                text = os.read(fd, st.st_size - fp.offset)
                cut = text.rfind(b"\n") + 1  # keep a half-written last line for the next read
                fp.offset += cut
                fp.step = last_step(text[:cut])
            elif st.st_size > fp.offset:
                os.lseek(fd, fp.offset, os.SEEK_SET)
                text = os.read(fd, min(st.st_size - fp.offset, MAX_READ_BYTES))
                cut = text.rfind(b"\n") + 1
                if cut:
                    fp.lines += text.count(b"\n", 0, cut)
                    step = last_step(text[:cut])
                    if step is not None:
                        if fp.step is not None and step < fp.step:
                            fp.history.clear()  # the job restarted from an earlier step
                        fp.step = step
                    fp.offset += cut
            fp.mtime = st.st_mtime

    def forget_except(self, paths: Iterable[str]) -> None:
        keep = set(paths)
        for path in [p for p in self.files if p not in keep]:
            del self.files[path]
