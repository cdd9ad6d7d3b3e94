"""Who stopped where: the last lines of every per-process trace file, grouped by how they end.

The seed did this with ``find . -name "trace*" -exec sh -c 'tail -5 "$1"' ...`` and
``grep -c``; here the endings are normalised (time stamps, pids, addresses) and compared, so the
rank that is somewhere else stands out.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ml_debug.core import safefs
from ml_debug.core.errors import UsageError
from ml_debug.core.safefs import Refused

FILE_RE = re.compile(r"^trace-(?P<host>.+)-(?P<rank>\d+|na)-(?P<pid>\d+)\.txt$")
# nicer format: "[H:MM:SS.ffffff ][[pid N] ]..."; seed format (--format seed): "[PID ][H:MM:SS ]..."
_PREFIX_RE = re.compile(r"^(?:\d+ (?=\d+:\d\d:\d\d |\s))?(?P<ts>\d+:\d\d:\d\d(?:\.\d+)? )?(?:\[pid \d+\] )?")
_TS_RE = re.compile(r"^(?:\d+ (?=\d+:\d\d:\d\d ))?(\d+):(\d\d):(\d\d)(?:\.(\d+))? ")
_ADDR_RE = re.compile(r"0x[0-9a-fA-F]+")
_ANON_THREAD_RE = re.compile(r"^\{thread-\d+\} ")
HEADER = "# nicertrace "  # the first line of every file NicerTrace writes (stream or ring dump)
BLOCK = 1 << 16
MAX_SCAN = 64 << 20  # bytes read backwards looking for main-thread lines before giving up
MAX_LONG_SCAN = 1 << 30  # ... and looking for the start of a very long last line
MAX_LINE = 4096  # bytes of one line kept for the report; the rest is cut, and how much is said


class NotATraceFile(ValueError):
    """A file that NicerTrace did not write (no header line); ``str(err)`` is the reason."""


@dataclass
class TraceFile:
    """One per-process trace file and how it ends."""

    path: str
    host: str | None
    rank: int | None
    pid: int | None
    mode: str | None  # "stream" or "ring(N)", from the file's header
    dump_reason: str | None  # ring files: why it was written (end, exit, idle 30s, signal SIGTERM)
    size_bytes: int
    tail: list[str]  # the last N event lines as written
    ending: list[str]  # the same lines normalised: what the grouping compares
    last_elapsed_s: float | None
    last_event_unix: float | None
    silent_for_s: float | None  # now minus the last event (for a live or hung process)
    grep_count: int | None = None
    group: str = ""

    @property
    def who(self) -> str:
        rank = f"rank {self.rank}" if self.rank is not None else "rank na"
        return f"{rank} ({self.host or '?'} pid {self.pid if self.pid is not None else '?'})"


@dataclass
class TailGroup:
    """Files whose normalised endings are identical."""

    id: str
    size: int
    odd: bool  # not the majority ending
    ranks: list[int | None]
    files: list[str]
    ending: list[str]


@dataclass
class TailReport:
    ok: bool
    summary: str
    paths: list[str]
    lines: int
    grep: str | None
    all_threads: bool
    files: list[TraceFile]
    groups: list[TailGroup]
    odd_files: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # {path, reason}: files not read, and why


def normalise(line: str) -> str:
    """A line without its time stamp, pid marker and memory addresses."""
    body = _PREFIX_RE.sub("", line, count=1)
    body = _ANON_THREAD_RE.sub("{thread} ", body)
    return _ADDR_RE.sub("0x?", body).rstrip()


def _is_event(line: str, all_threads: bool) -> bool:
    if not line.strip() or line.startswith("#"):
        return False
    return all_threads or not _PREFIX_RE.sub("", line, count=1).startswith("{")


def _elapsed(line: str) -> float | None:
    m = _TS_RE.match(line)
    if not m:
        return None
    h, mi, s, frac = m.groups()
    return int(h) * 3600 + int(mi) * 60 + int(s) + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _locate(paths: Iterable[str | os.PathLike[str]]) -> tuple[dict[Path, Path], list[dict[str, str]]]:
    """{path as shown: path to open} for the trace files among the given files and directories, and
    the files found under a directory as ``trace-*.txt`` that are not named like one (skipped).

    A directory named here is resolved once (the operator chose it); below it no symbolic link to a
    directory is walked, and a symbolic link named like a trace file is kept so that reading it can
    refuse it with a reason."""
    found: dict[Path, Path] = {}
    skipped: list[dict[str, str]] = []
    for name in paths:
        if not os.fspath(name):  # Path("") would be the current directory
            raise UsageError("empty path ''", "give trace files, or the --out-dir that `mldebug trace` wrote to "
                                              "(. for the current directory)")
        p = Path(name)
        if p.is_dir():
            root = Path(os.path.realpath(p))
            for f in p.rglob("trace-*.txt"):
                if not f.is_symlink() and f.is_dir():
                    continue
                if FILE_RE.match(f.name):
                    found[f] = root / f.relative_to(p)
                else:
                    skipped.append({"path": str(f), "reason": f"{f} is not named trace-HOST-RANK-PID.txt: not read"})
        elif os.path.lexists(p):
            found[p] = Path(os.path.realpath(p.parent)) / p.name
        else:
            raise UsageError(f"no such file or directory: {p}", "give the --out-dir that `mldebug trace` wrote to")
    return dict(sorted(found.items())), sorted(skipped, key=lambda s: s["path"])


def find_trace_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Trace files among the given files and directories (searched recursively, like the seed's find)."""
    return list(_locate(paths)[0])


def open_trace_file(path: Path, shown: Path | None = None) -> BinaryIO:
    """Open a trace file that another user wrote, for reading only what it is.

    The files of a job belong to its user and mldebug may run as root: a symbolic link, a FIFO or a
    device named like a trace file is refused (no link is followed, nothing blocks), and so is a
    hard link to a file of another user than the directory's (a way to show root another file).
    """
    fd, _ = safefs.open_found(os.path.abspath(path), str(shown or path))
    return os.fdopen(fd, "rb")


def _header(f: BinaryIO, shown: Path) -> dict[str, str]:
    """The header's fields (:class:`NotATraceFile` when the file does not start with one)."""
    f.seek(0)
    head = f.read(4096).decode("utf-8", "replace").splitlines()
    if not head or not head[0].startswith(HEADER):
        raise NotATraceFile(f"{shown} is not a trace file: its first line is not {HEADER.strip()!r}")
    info: dict[str, str] = {}
    for line in head[:2]:
        if line.startswith(HEADER) or line.startswith("# dump "):
            for token in line[2:].split(" "):
                key, eq, value = token.partition("=")
                if eq and key not in info:
                    info[key] = value
            if line.startswith("# dump "):
                m = re.search(r"reason=(.*?) at=", line)
                if m:
                    info["reason"] = m.group(1)
    return info


def cut_line(data: bytes, length: int) -> str:
    """A line of `length` bytes whose first bytes are `data`, as text: at most MAX_LINE bytes of it,
    with how much was cut said at the end."""
    text = data[:MAX_LINE].decode("utf-8", "replace")
    if length > MAX_LINE:
        text += f" … [{length - MAX_LINE:,} more bytes cut]"
    return text


def _last_lines(f: BinaryIO, n: int, all_threads: bool) -> list[str]:
    """The last n event lines, reading backwards in blocks (trace files can be huge).

    Memory stays bounded whatever the lines: the scan keeps one block and where lines start and end;
    a line longer than MAX_LINE bytes is read back as its first MAX_LINE bytes (:func:`cut_line`)."""
    f.seek(0, os.SEEK_END)
    end = f.tell()
    pos, line_end, scanned = end, end, 0
    newest_first: list[str] = []

    def take(start: int, stop: int, block: bytes, base: int) -> bool:
        """Keep the line [start, stop) if it is an event; True when n lines are kept."""
        if base <= start and stop - start <= MAX_LINE:
            data = block[start - base:stop - base]
        else:  # it began before this block, or is long: only its first bytes are read
            here = f.tell()
            f.seek(start)
            data = f.read(min(stop - start, MAX_LINE))
            f.seek(here)
        text = cut_line(data, stop - start)
        if _is_event(text, all_threads):
            newest_first.append(text)
        return len(newest_first) >= n

    # past MAX_SCAN only while no event line was found yet: one very long last line must still be found
    # (its start), which costs reading, not memory
    while pos > 0 and (scanned < MAX_SCAN or (not newest_first and scanned < MAX_LONG_SCAN)):
        step = min(BLOCK if scanned < MAX_SCAN else BLOCK << 4, pos)
        pos -= step
        f.seek(pos)
        block = f.read(step)
        scanned += step
        i = len(block)
        while True:
            j = block.rfind(b"\n", 0, i)
            if j < 0:
                break
            if take(pos + j + 1, line_end, block, pos):
                return newest_first[::-1]
            line_end, i = pos + j, j
        if pos == 0 and take(0, line_end, block, pos):
            return newest_first[::-1]
    return newest_first[::-1]


def _grep_count(f: BinaryIO, pattern: re.Pattern[str]) -> int:
    """Event lines that match, read in pieces of MAX_LINE bytes (a long line is never held whole; a
    match that spans two pieces of one long line is not seen)."""
    f.seek(0)
    count, at_start, comment, matched = 0, True, False, False
    while True:
        piece = f.readline(MAX_LINE)
        if not piece:
            return count
        if at_start:
            comment, matched = piece.startswith(b"#"), False
        if not comment and not matched and pattern.search(piece.decode("utf-8", "replace")):
            matched = True
            count += 1
        at_start = piece.endswith(b"\n")


def read_trace_file(path: Path, n: int, all_threads: bool = False,
                    grep: re.Pattern[str] | None = None, now: float | None = None, real: Path | None = None
                    ) -> TraceFile:
    """Parse one file: name parts, header, its last n event lines (:class:`Refused` if it is not a
    regular file, :class:`NotATraceFile` if NicerTrace did not write it).

    `real` is where to open it when `path` (as shown) has been resolved already."""
    m = FILE_RE.match(path.name)
    with open_trace_file(real or path, path) as f:
        info = _header(f, path)
        tail = _last_lines(f, n, all_threads)
        size = os.fstat(f.fileno()).st_size
        grep_count = _grep_count(f, grep) if grep is not None else None
    last = _elapsed(tail[-1]) if tail else None
    start = float(info["start_unix"]) if info.get("start_unix", "").replace(".", "", 1).isdigit() else None
    last_unix = start + last if start is not None and last is not None else None
    now = time.time() if now is None else now

    def num(value: str | None) -> int | None:
        return int(value) if value is not None and value.isdigit() else None

    return TraceFile(
        path=str(path),
        host=m.group("host") if m else info.get("host"),
        rank=num(m.group("rank")) if m else num(info.get("rank")),
        pid=num(m.group("pid")) if m else num(info.get("pid")),
        mode=info.get("mode"),
        dump_reason=info.get("reason"),
        size_bytes=size,
        tail=[t.rstrip("\n") for t in tail],
        ending=[normalise(t) for t in tail],
        last_elapsed_s=last,
        last_event_unix=last_unix,
        silent_for_s=round(now - last_unix, 3) if last_unix is not None else None,
        grep_count=grep_count,
    )


def _labels() -> Iterator[str]:
    for i in range(10_000):
        yield chr(ord("A") + i) if i < 26 else f"G{i + 1}"


def _rank_key(f: TraceFile) -> tuple[int, int, str]:
    return (f.rank if f.rank is not None else 1 << 30, f.pid or 0, f.path)


def tail_traces(paths: Iterable[str | os.PathLike[str]], lines: int = 5, grep: str | None = None,
                all_threads: bool = False) -> TailReport:
    """Group trace files by their last ``lines`` event lines; odd groups are the suspects.

    Shell equivalent: ``find DIR -name 'trace*' -exec sh -c 'echo $1; tail -5 $1' _ {} \\;``.
    """
    if lines < 1:
        raise UsageError(f"-n must be at least 1, got {lines}", "try -n 5")
    pattern = None
    if grep is not None:
        try:
            pattern = re.compile(grep)
        except re.error as e:
            raise UsageError(f"bad --grep pattern {grep!r}: {e}", "it is a Python regular expression") from e
    names: list[str] = [str(os.fspath(p)) for p in paths] or ["."]
    found, skipped = _locate(names)
    if not found and not skipped:
        raise UsageError(f"no trace files (trace-HOST-RANK-PID.txt) under {', '.join(names)}",
                         "run the program with `mldebug trace --out-dir DIR -- script.py`, then point "
                         "trace-tail at DIR")
    now = time.time()
    read: list[TraceFile] = []
    for p, real in found.items():
        try:
            read.append(read_trace_file(p, lines, all_threads, pattern, now, real))
        except Refused as e:
            skipped.append({"path": str(p), "reason": f"refused: {e}"})
        except NotATraceFile as e:
            skipped.append({"path": str(p), "reason": str(e)})
        except OSError as e:
            skipped.append({"path": str(p), "reason": f"cannot read {p}: {e.strerror or e}"})
    if not read:
        why = "; ".join(f"{s['reason']}" for s in skipped[:3]) + (f" (+{len(skipped) - 3} more)" if len(skipped) > 3 else "")
        raise UsageError(f"no usable trace files under {', '.join(names)}: {why}",
                         "give the files or the --out-dir that `mldebug trace` wrote: regular files named "
                         "trace-HOST-RANK-PID.txt that start with a '# nicertrace' line")
    files = sorted(read, key=_rank_key)
    by_ending: dict[tuple[str, ...], list[TraceFile]] = {}
    for f in files:
        by_ending.setdefault(tuple(f.ending), []).append(f)
    ordered = sorted(by_ending.items(), key=lambda kv: (-len(kv[1]), _rank_key(kv[1][0])))
    majority = len(ordered) == 1 or len(ordered[0][1]) > len(ordered[1][1])
    groups: list[TailGroup] = []
    for label, (ending, members) in zip(_labels(), ordered):  # noqa: B905 (labels are endless)
        odd = not (majority and not groups)
        for f in members:
            f.group = label
        groups.append(TailGroup(id=label, size=len(members), odd=odd if len(ordered) > 1 else False,
                                ranks=[f.rank for f in members], files=[f.path for f in members],
                                ending=list(ending)))
    odd_files = [f.path for g in groups if g.odd for f in files if f.group == g.id]
    summary = _summary(files, groups, majority)
    if skipped:
        summary += f"; skipped {len(skipped)} file(s): " + "; ".join(f"{s['reason']}" for s in skipped[:4])
    return TailReport(ok=len(groups) == 1, summary=summary, paths=names,
                      lines=lines, grep=grep, all_threads=all_threads, files=files, groups=groups,
                      odd_files=odd_files, skipped=skipped)


def _summary(files: list[TraceFile], groups: list[TailGroup], majority: bool) -> str:
    def last(ending: list[str]) -> str:
        return ending[-1].strip() if ending else "(no events)"

    n = len(files)
    if len(groups) == 1:
        return f"all {n} trace file{'s' if n != 1 else ''} end the same way, last: {last(groups[0].ending)}"
    if majority:
        odd = [f for f in files if f.group != groups[0].id]
        names = ", ".join(f"{f.who} at: {last(f.ending)}" for f in odd[:4])
        more = f" (+{len(odd) - 4} more)" if len(odd) > 4 else ""
        return (f"{groups[0].size} of {n} trace files end the same way ({last(groups[0].ending)}); "
                f"different: {names}{more}")
    sizes = " / ".join(str(g.size) for g in groups)
    return f"no common ending: {n} trace files split into {len(groups)} groups ({sizes}); see each group's last lines"
