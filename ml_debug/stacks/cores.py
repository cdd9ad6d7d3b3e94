"""core-bt: find core files, match each to its executable, and print every thread's backtrace with
the Python frames; cores with the same crash are grouped.

Shell equivalents: ``cat /proc/sys/kernel/core_pattern``, ``gdb -batch <exe> <core> -ex 'thread
apply all bt' -ex 'thread apply all py-bt'``, ``pystack core <core>``.
"""

from __future__ import annotations

import fnmatch
import os
import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ml_debug.core import safefs
from ml_debug.core.errors import ExitCode, UsageError
from ml_debug.core.extras import PARTS, MissingPart, find_program
from ml_debug.core.output import log, progress
from ml_debug.core.safefs import Refused
from ml_debug.stacks.dumpers import gdb_argv, gdb_python_helper
from ml_debug.stacks.elfcore import BadCore, executable_of, is_core_fd, read_notes_fd, truncation
from ml_debug.stacks.parsers import parse_gdb, parse_pystack
from ml_debug.stacks.result import Frame, ThreadDump
from ml_debug.stacks.tools import first_error_line, run_tool

CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")
CORE_USES_PID = Path("/proc/sys/kernel/core_uses_pid")
_SPEC = re.compile(r"%.")


@dataclass
class CoreSearch:
    """Where cores were looked for, and what the kernel setting says."""

    core_pattern: str
    piped: bool
    globs: list[str] = field(default_factory=list)  # absolute glob patterns searched
    notes: list[str] = field(default_factory=list)


def pattern_globs(pattern: str, uses_pid: bool, dirs: list[Path]) -> list[str]:
    """Glob patterns for the core files a core_pattern produces (relative ones in each of `dirs`)."""
    text = pattern.strip().replace("%%", "\0")
    glob = _SPEC.sub("*", text).replace("\0", "%")
    if uses_pid and "%p" not in text:
        variants = [glob, glob + ".*"]
    else:
        variants = [glob]
    out: list[str] = []
    for v in variants:
        if v.startswith("/"):
            out.append(v)
        else:
            out.extend(str(d / v) for d in dirs)
    return out


def _core_at(path: Path) -> tuple[bool, os.stat_result | None, str | None]:
    """(is a core, its stat, why it was refused): opened like any file from a job's directory."""
    try:
        fd, st = safefs.open_found(os.path.abspath(path), str(path))
    except Refused as e:
        return False, None, str(e)
    except OSError:
        return False, None, None
    try:
        return is_core_fd(fd), st, None
    finally:
        os.close(fd)


MAX_SCAN_DEPTH = 8  # run7/rank1/core.4242 is depth 1; a Hydra tree about 4
MAX_SCAN_ENTRIES = 50_000  # names looked at under one directory given: a home directory is no place for this


def _core_setting() -> CoreSearch:
    try:
        pattern = CORE_PATTERN.read_text().strip()
    except OSError:
        pattern = "core"
    search = CoreSearch(core_pattern=pattern, piped=pattern.startswith("|"))
    if search.piped:
        handler = pattern[1:].split()[0]
        hint = ("coredumpctl list; coredumpctl dump PID -o core.PID" if "systemd-coredump" in handler
                else "/var/crash (apport: apport-unpack)" if "apport" in handler else f"see {handler}")
        search.notes.append(f"core_pattern pipes cores to {handler}: they are not written as files here ({hint})")
    return search


def _pattern_globs(search: CoreSearch) -> list[str]:
    """Where core_pattern puts cores: a relative pattern in the current directory."""
    if search.piped:
        search.notes.append("searching for 'core*' files here anyway")
        return [str(Path.cwd() / "core*")]
    try:
        uses_pid = CORE_USES_PID.read_text().strip() == "1"
    except OSError:
        uses_pid = False
    return pattern_globs(search.core_pattern, uses_pid, [Path.cwd()])


def _named(paths: list[Path], dirs: list[Path]) -> tuple[list[Path], list[Path]]:
    """(files, directories) the operator named; a missing path or a --dir that is no directory is a
    usage error."""
    files: list[Path] = []
    for p in paths:
        if not os.path.lexists(p):
            raise UsageError(f"{p} does not exist", "give core files or directories to search")
        (dirs if p.is_dir() else files).append(p)
    for d in dirs:
        if not os.path.lexists(d):
            raise UsageError(f"--dir {d} does not exist", "give directories to search for core files")
        if not d.is_dir():
            raise UsageError(f"--dir {d} is not a directory", "name a core file without --dir")
    return files, dirs


def find_cores(paths: list[Path], dirs: list[Path] | None = None, newest: int | None = None) -> tuple[list[Path], CoreSearch]:
    """Core files named on the command line, every core file under the directories named (whatever
    its name), or, with neither, the cores /proc/sys/kernel/core_pattern puts in the current directory.

    Core files sit in the jobs' own directories and mldebug may run as root: a symbolic link, a FIFO
    or a device in a directory is skipped (never followed, never opened); one named on the command
    line is a usage error."""
    search = _core_setting()
    files, named_dirs = _named(paths, list(dirs or []))
    found: dict[tuple[int, int], tuple[Path, os.stat_result]] = {}

    def add(p: Path, st: os.stat_result) -> None:
        found.setdefault((st.st_dev, st.st_ino), (p, st))

    for p in files:
        p = Path(os.path.realpath(p.parent)) / p.name  # the operator named it; its last part stays unfollowed
        ok, st, refused = _core_at(p)
        if refused:
            raise UsageError(f"not a core file: {refused}", "name the core file itself (a regular file)")
        if not ok or st is None:
            raise UsageError(f"{p} is not a core file (not an ELF core)", "file(1) says what it is")
        add(p, st)
    if named_dirs:
        for d in named_dirs:  # the directories are the operator's choice, resolved once
            root = Path(os.path.realpath(d))
            search.globs.append(str(root / "**"))
            _scan_tree(root, add, search.notes)
    elif not files:
        search.globs = _pattern_globs(search)
        for g in search.globs:
            _scan_glob(g, add, search.notes)
    ordered = sorted(found.values(), key=lambda ps: ps[1].st_mtime, reverse=True)
    return [p for p, _ in ordered[:newest or None]], search


def _add_if_core(p: Path, add: Callable[[Path, os.stat_result], None], notes: list[str]) -> None:
    ok, st, refused = _core_at(p)
    if refused:
        notes.append(f"skipped {refused}")
    elif ok and st is not None:
        add(p, st)


def _scan_glob(g: str, add: Callable[[Path, os.stat_result], None], notes: list[str]) -> None:
    """The files matching one core_pattern glob that are cores."""
    directory, base = os.path.split(g)
    if any(ch in directory for ch in "*?["):
        notes.append(f"skipped {g}: a directory with wildcards")
        return
    try:
        entries = os.listdir(directory)
    except OSError as e:
        notes.append(f"could not read directory {directory}: {e.strerror or e}")
        return
    for name in sorted(entries):
        if fnmatch.fnmatch(name, base):
            _add_if_core(Path(directory) / name, add, notes)


def _scan_tree(root: Path, add: Callable[[Path, os.stat_result], None], notes: list[str]) -> None:
    """Every core file under `root`, by its ELF header rather than its name: ranks write core.PID,
    core, core.python.1234 or whatever the job's own pattern was, and a copy may be renamed.

    Symbolic links are not followed and the walk is bounded (depth and names looked at): what lies
    inside is not trusted, and each file is opened through safefs as one named in a job's directory."""
    budget = MAX_SCAN_ENTRIES
    stack = [(root, 0)]
    too_deep = False
    while stack:
        d, depth = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    budget -= 1
                    if budget < 0:
                        notes.append(f"stopped searching {root} after {MAX_SCAN_ENTRIES} names: "
                                     "give the directory of the failed run")
                        return
                    if e.is_dir(follow_symlinks=False):
                        too_deep |= depth >= MAX_SCAN_DEPTH
                        if depth < MAX_SCAN_DEPTH:
                            stack.append((Path(e.path), depth + 1))
                    elif e.is_file(follow_symlinks=False) or e.name.startswith("core"):
                        _add_if_core(Path(e.path), add, notes)  # a link or a FIFO named core: why it is not read
        except OSError as e:
            if d == root:
                raise UsageError(f"cannot read directory {d}: {e.strerror or e}",
                                 "run mldebug as a user who may read it (sudo)") from None
            notes.append(f"could not read directory {d}: {e.strerror or e}")
    if too_deep:
        notes.append(f"searched {root} {MAX_SCAN_DEPTH} directories deep, not deeper: give a deeper directory")


@dataclass
class CoreReport:
    path: str
    size: int
    mtime: float
    ok: bool
    pid: int | None = None
    signal: str | None = None
    executable: str | None = None
    cmdline: str | None = None
    tool: str | None = None
    error: str | None = None
    threads: list[ThreadDump] = field(default_factory=list)  # the crashing thread first
    crash_frame: str | None = None  # innermost native frame of the crashing thread
    python_frames: list[str] = field(default_factory=list)  # crashing thread, innermost first
    seconds: float = 0.0


_SIGNAL_LINE = re.compile(r"Program terminated with signal (SIG\w+)")


def analyse_core(path: Path, timeout: float = 120.0, executable: str | None = None) -> CoreReport:
    """Backtraces of every thread of one core: gdb (+ the interpreter's py-bt), else pystack core."""
    t0 = time.monotonic()
    try:
        fd, st = safefs.open_found(os.path.abspath(path), str(path))
    except (Refused, OSError) as e:
        return CoreReport(path=str(path), size=0, mtime=0.0, ok=False, error=f"not read: {e}")
    try:
        return _analyse_fd(path, fd, st, t0, timeout, executable)
    except (BadCore, struct.error, OverflowError) as e:  # this core is not read; the others still are
        return CoreReport(path=str(path), size=st.st_size, mtime=st.st_mtime, ok=False, error=f"not read: {e}",
                          seconds=round(time.monotonic() - t0, 3))
    finally:
        os.close(fd)


def _analyse_fd(path: Path, fd: int, st: os.stat_result, t0: float, timeout: float, executable: str | None
                ) -> CoreReport:
    report = CoreReport(path=str(path), size=st.st_size, mtime=st.st_mtime, ok=False)
    notes = read_notes_fd(fd)
    report.pid, report.signal, report.cmdline = notes.pid, notes.signal_name, notes.psargs
    # gdb and pystack read the very file checked above, through our descriptor, not by its name
    core_file = f"/proc/{os.getpid()}/fd/{fd}"

    def said(output: str) -> str:
        """A tool's error, naming the core the way the operator did, not by our descriptor."""
        return first_error_line(output).replace(core_file, str(path))

    exe = executable or executable_of(notes)
    report.executable = exe
    gdb, pystack = find_program("gdb"), find_program("pystack")
    errors: list[str] = []
    if gdb:
        helper = gdb_python_helper(exe=exe) if exe else None
        target = [exe, core_file] if exe else ["-c", core_file]
        run = run_tool(gdb_argv(gdb, helper, target), timeout)
        threads = parse_gdb(run.stdout, None) if not run.timed_out else []
        if threads and any(t.native_frames for t in threads):
            report.ok, report.tool, report.threads = True, "gdb" + (" + py-bt" if helper else ""), threads
            m = _SIGNAL_LINE.search(run.stdout)
            if m:
                report.signal = m.group(1)
        else:
            errors.append("gdb: " + ("timed out" if run.timed_out else said(run.stderr or run.stdout)))
    crashing = report.threads[0] if report.threads else None
    if pystack and (crashing is None or not crashing.python_frames()):
        argv = [pystack, "core", core_file, *([exe] if exe else []), "--native"]
        run = run_tool(argv, timeout)
        py_threads = parse_pystack(run.stdout, notes.pid or -1) if run.rc == 0 else []
        if py_threads:
            by_tid = {t.os_thread_id: t for t in py_threads}
            if report.threads:  # keep gdb's native frames, add pystack's Python frames
                for t in report.threads:
                    if t.os_thread_id in by_tid and not t.python_frames():
                        t.frames = by_tid[t.os_thread_id].frames
                report.tool = (report.tool or "gdb") + " + pystack"
            else:
                report.ok, report.tool, report.threads = True, "pystack", py_threads
        elif run.rc != 0:
            errors.append("pystack: " + said(run.stderr))
    if not gdb and not pystack:
        raise MissingPart(PARTS["gdb"], "core-bt (gdb or pystack reads a core file)",
                          instead=f"{PARTS['pystack'].install} (pystack)")
    if report.threads:
        crashing = report.threads[0]
        natives = crashing.native_frames
        report.crash_frame = natives[0].where() if natives else None
        report.python_frames = [f.where(brief=True) for f in crashing.python_frames()]
    else:
        report.error = "; ".join(errors) or "no backtrace"
    cut = truncation(notes, st.st_size)
    if cut:  # the frames read are still shown, but they may be wrong: this core is not fully read
        report.ok = False
        report.error = cut + ("; " + report.error if report.error else "")
    if exe is None:
        report.error = (report.error + "; " if report.error else "") + \
            "executable not found (pass --exe): symbols and Python frames may be missing"
    report.seconds = round(time.monotonic() - t0, 3)
    return report


def read_cores(paths: list[Path], timeout: float = 120.0, executable: str | None = None
               ) -> tuple[list[CoreReport], bool]:
    """(reports, interrupted): :func:`analyse_core` for each core in turn, a line on stderr as each
    of several is read.

    Ctrl-C ends the reading: the cores read so far are kept (the second value is then True); with
    none read, Ctrl-C propagates, as in dump-stacks' --samples. (A second SIGINT right after, as
    `timeout -s INT` sends, is the same Ctrl-C: see ml_debug.cli.app.main.)"""
    reports: list[CoreReport] = []
    with progress(len(paths), "reading cores") as bar:
        try:
            for i, path in enumerate(paths, 1):
                reports.append(analyse_core(path, timeout, executable))
                bar.advance()
                if len(paths) > 1:
                    log(f"core-bt: core {i}/{len(paths)} read: {path} ({reports[-1].tool or 'not read'})")
        except KeyboardInterrupt:
            if not reports:
                raise
            return reports, True
    return reports, False


def _names(frames: list[Frame], n: int = 12) -> tuple[str, ...]:
    return tuple(f.name for f in frames[:n])


@dataclass(frozen=True)
class CoreGroup:
    """Cores whose crashing threads died the same way (signal, native and Python frame names)."""

    id: str
    count: int
    signal: str | None
    executable: str | None
    crash_frame: str | None
    python_frames: list[str]
    cores: list[str]  # paths, the first one shown


@dataclass(frozen=True)
class CoreBtResult:
    """The ``result`` of ``mldebug core-bt --json``."""

    ok: bool  # no core found
    summary: str
    exit_code: ExitCode
    core_pattern: str
    searched: list[str]  # the glob patterns looked at
    notes: list[str]
    groups: list[CoreGroup]  # most common crash first
    cores: list[CoreReport]
    interrupted: bool = False  # Ctrl-C stopped the reading: the cores read are the result (exit 130)


def group_cores(reports: list[CoreReport]) -> list[CoreGroup]:
    """Cores whose crashing threads have the same native and Python stacks (names only) form one group;
    a core only partly read (truncated) is grouped with what was read of it."""
    groups: dict[tuple[Any, ...], list[CoreReport]] = {}
    for r in reports:
        if not r.threads:
            continue
        t = r.threads[0]
        key = (r.signal, _names(t.native_frames), _names(t.python_frames()))
        groups.setdefault(key, []).append(r)
    out = []
    for i, (_, rs) in enumerate(sorted(groups.items(), key=lambda kv: -len(kv[1]))):
        first = rs[0]
        out.append(CoreGroup(id=chr(ord("A") + i) if i < 26 else f"G{i}", count=len(rs), signal=first.signal,
                             executable=first.executable, crash_frame=first.crash_frame,
                             python_frames=first.python_frames, cores=[r.path for r in rs]))
    return out


def core_summary(reports: list[CoreReport], groups: list[CoreGroup], search: CoreSearch) -> str:
    if not reports:
        where = ", ".join(search.globs) or "the paths given"
        return f"no core files found (searched {where}; core_pattern is {search.core_pattern!r})"
    if not groups:
        return f"{len(reports)} core file(s) found, none could be read"
    g = groups[0]
    first = next(r for r in reports if r.path == g.cores[0])
    prog = os.path.basename(first.executable or first.cmdline or "?")
    py = f"; Python: {' <- '.join(g.python_frames[:3])}" if g.python_frames else ""
    head = (f"{prog} (pid {first.pid}) killed by {g.signal or 'a signal'} in {g.crash_frame or '?'}{py}"
            if len(reports) == 1 else
            f"{len(reports)} cores, {len(groups)} distinct crash(es); most common ({g.count}x): "
            f"{g.signal or 'signal'} in {g.crash_frame or '?'}{py}")
    unread = sum(not r.ok for r in reports)
    tail = f"; {unread} of {len(reports)} core(s) not fully read" if unread else ""
    return f"crash: {head}{tail}"


def core_bt_result(reports: list[CoreReport], search: CoreSearch, interrupted_of: int | None = None
                   ) -> CoreBtResult:
    """Group the cores read and say what they show: exit 0 when none was found, 1 when every one was
    read (crash backtraces shown), 4 when some could not be read, 130 when Ctrl-C stopped the reading
    (`interrupted_of`: the number of cores found) with these read."""
    groups = group_cores(reports)
    summary, notes = core_summary(reports, groups, search), list(search.notes)
    if interrupted_of is not None:
        code = ExitCode.INTERRUPTED
        summary += f" (interrupted after {len(reports)} of {interrupted_of} cores read)"
        notes.append(f"interrupted (Ctrl-C) after {len(reports)} of {interrupted_of} cores: those read are shown")
    elif not reports:
        code = ExitCode.OK
    elif any(not r.ok for r in reports):
        code = ExitCode.PARTIAL
    else:
        code = ExitCode.PROBLEM
    return CoreBtResult(ok=not reports and interrupted_of is None, summary=summary, exit_code=code,
                        core_pattern=search.core_pattern, searched=search.globs, notes=notes, groups=groups,
                        cores=reports, interrupted=interrupted_of is not None)
