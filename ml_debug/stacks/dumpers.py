"""Dump one process: py-spy, then py-spy --nonblocking, then pystack, then gdb; each with a timeout.

Shell equivalents: ``py-spy dump --json --pid P``, ``pystack remote P``,
``gdb -batch -p P -ex 'thread apply all bt' -ex 'thread apply all py-bt'``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from ml_debug.core.errors import UsageError
from ml_debug.core.extras import PARTS, MissingPart, find_program
from ml_debug.core.ptrace import PtraceCheck
from ml_debug.procs.tree import process_state
from ml_debug.stacks.parsers import PYBT_MARK, parse_gdb, parse_pyspy_json, parse_pystack
from ml_debug.stacks.result import Attempt, ProcessDump, ThreadDump
from ml_debug.stacks.tools import ToolRun, first_error_line, run_tool

DUMPERS = ("auto", "py-spy", "pystack", "gdb")


@dataclass
class DumpOptions:
    timeout: float = 10.0  # per py-spy/pystack attempt
    gdb_timeout: float = 60.0  # gdb loads libtorch's symbols: seconds, not milliseconds
    native: bool = False
    locals: bool = False
    dumper: str = "auto"


@dataclass
class Tools:
    py_spy: str | None
    pystack: str | None
    gdb: str | None

    def chain(self, dumper: str) -> list[str]:
        if dumper == "auto":
            return [n for n, p in (("py-spy", self.py_spy), ("pystack", self.pystack), ("gdb", self.gdb)) if p]
        return [str(dumper)]


def resolve_tools(dumper: str) -> Tools:
    """Find the dumpers; the one asked for (py-spy for auto) must exist, else exit 3 with the install hint."""
    dumper = str(dumper)  # a Dumper is its value: PARTS and the attributes below are keyed by it
    if dumper not in DUMPERS:
        raise UsageError(f"unknown dumper {dumper!r}", f"choose one of: {', '.join(DUMPERS)}")
    tools = Tools(find_program("py-spy"), find_program("pystack"), find_program("gdb"))
    needed = "py-spy" if dumper == "auto" else dumper
    if getattr(tools, needed.replace("-", "_")) is None:
        others = " | ".join(f"--dumper {d}" for d in DUMPERS[1:] if d != needed)
        raise MissingPart(PARTS[needed], "mldebug dump-stacks" + (f" --dumper {dumper}" if dumper != "auto" else ""),
                          instead=f"choose another dumper: {others}" if dumper in ("auto", "py-spy") else None)
    return tools


def gdb_python_helper(pid: int | None = None, exe: str | None = None) -> str | None:
    """The interpreter's gdb extension (python3.X-gdb.py next to the real executable) that adds py-bt."""
    if exe is None and pid is not None:
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            return None
    if not exe:
        return None
    real = os.path.realpath(exe)
    base = os.path.basename(real)
    candidates = [real + "-gdb.py", f"/usr/share/gdb/auto-load{real}-gdb.py"]
    libdir = os.path.join(os.path.dirname(os.path.dirname(real)), "lib")
    candidates += [os.path.join(libdir, f"lib{base}.so.1.0-gdb.py"),
                   f"/usr/share/gdb/auto-load/usr/lib/x86_64-linux-gnu/lib{base}.so.1.0-gdb.py"]
    # gdb runs it as root: only a file no other user can write (never one from the job's own tree)
    from ml_debug.core.safefs import trusted_system_file

    return next((c for c in candidates if os.path.isfile(c) and trusted_system_file(c)), None)


def gdb_argv(gdb: str, helper: str | None, target: list[str]) -> list[str]:
    argv = [gdb, "-batch", "-nx", "-iex", "set auto-load python-scripts off", "-iex", "set pagination off",
            "-iex", "set print frame-arguments none", *target, "-ex", "thread apply all bt"]
    if helper:
        argv += ["-ex", f"source {helper}", "-ex", f"echo {PYBT_MARK}\\n", "-ex", "thread apply all py-bt"]
    return argv


class _Gone(Exception):
    pass


def _why(pid: int, stderr: str, timed_out: bool, limit: float, option: str, ptrace: PtraceCheck | None,
         target_uid: int | None) -> tuple[str, str | None, bool]:
    """(reason, fix, final): final means no other dumper can do better. A timeout names the limit
    the user set (`option`), not the time it took to stop a dumper that ignored SIGTERM."""
    state = process_state(pid)
    if state is None:
        return "process exited during the dump", None, True
    if state == "Z":
        return "process exited (zombie: its parent has not reaped it yet)", None, True
    if timed_out:
        return f"timed out after {limit:g} s", f"raise {option}; a process in state D (uninterruptible I/O) " \
            "cannot be attached until the I/O returns", False
    low = stderr.lower()
    if "permission denied" in low or "operation not permitted" in low or "eperm" in low:
        deny = ptrace.denial(target_uid) if ptrace else None
        if deny:
            return f"permission denied: {deny[0]}", deny[1], True
        return "permission denied by ptrace", "run mldebug with sudo, or as the job's user", True
    if "failed to find python version" in low or "could not determine python version" in low:
        return "not a Python process", f"for its native stack: mldebug dump-stacks --dumper gdb --pid {pid}", True
    return first_error_line(stderr), None, False


def _pyspy(tools: Tools, pid: int, opts: DumpOptions, nonblocking: bool) -> tuple[list[ThreadDump] | None, ToolRun]:
    argv = [tools.py_spy or "py-spy", "dump", "--json", "--pid", str(pid)]
    if nonblocking:
        argv.append("--nonblocking")  # py-spy refuses --native with --nonblocking
    elif opts.native:
        argv.append("--native")
    if opts.locals:
        argv.append("--locals")
    run = run_tool(argv, opts.timeout, pid)
    if run.rc == 0:
        try:
            return parse_pyspy_json(run.stdout, pid), run
        except (json.JSONDecodeError, TypeError, AttributeError):
            pass
    return None, run


def dump_process(pid: int, tools: Tools, opts: DumpOptions, ptrace: PtraceCheck | None = None,
                 target_uid: int | None = None) -> ProcessDump:
    """Dump one process through the dumper chain; never raises, never leaves it stopped."""
    started = time.time()
    t0 = time.monotonic()
    result = ProcessDump(pid=pid, ok=False, taken_at=started)
    state = process_state(pid)
    if state is None or state == "Z":
        result.error = ("process exited before it could be dumped" if state is None
                        else "process exited (zombie: its parent has not reaped it yet)")
        result.seconds = time.monotonic() - t0
        return result

    steps: list[str] = []
    for name in tools.chain(opts.dumper):
        steps += ["py-spy", "py-spy --nonblocking"] if name == "py-spy" else [name]
    for step in steps:
        if step.startswith("py-spy"):
            threads, run = _pyspy(tools, pid, opts, nonblocking=step.endswith("nonblocking"))
        elif step == "pystack":
            argv = [tools.pystack or "pystack", "remote", str(pid)]
            if opts.native:
                argv.append("--native")
            if opts.locals:
                argv.append("--locals")
            run = run_tool(argv, opts.timeout, pid)
            threads = parse_pystack(run.stdout, pid) if run.rc == 0 else None
        else:
            helper = gdb_python_helper(pid)
            run = run_tool(gdb_argv(tools.gdb or "gdb", helper, ["-p", str(pid)]), opts.gdb_timeout, pid)
            threads = parse_gdb(run.stdout, pid) if run.rc == 0 else None
            if threads is not None and not any(t.native_frames for t in threads):
                threads = None  # gdb says rc 0 even when it could not attach
                run.stderr = run.stderr or run.stdout
        if threads:
            result.attempts.append(Attempt(step, True, round(run.seconds, 3)))
            result.ok, result.dumper, result.threads = True, step, threads
            result.error = None
            break
        limit, option = (opts.gdb_timeout, "--gdb-timeout") if step == "gdb" else (opts.timeout, "--attach-timeout")
        reason, fix, final = _why(pid, run.stderr, run.timed_out, limit, option, ptrace, target_uid)
        result.attempts.append(Attempt(step, False, round(run.seconds, 3), reason))
        result.error, result.fix = reason, fix
        if final:
            break
    result.seconds = round(time.monotonic() - t0, 3)
    return result
