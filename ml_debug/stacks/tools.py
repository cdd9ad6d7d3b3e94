"""Find the external dumpers (py-spy, pystack, gdb) and run them with a hard timeout."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass

from ml_debug.core import lifecycle
from ml_debug.procs.tree import process_state


@dataclass
class ToolRun:
    rc: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool


def run_tool(argv: list[str], timeout: float, target_pid: int | None = None) -> ToolRun:
    """Run a dumper; at the timeout stop it (TERM, then KILL) and make sure the target is running again.

    A tracer killed while its target is ptrace-stopped can leave the target in state T; a hung job
    we looked at must never be left frozen by us, so it gets a SIGCONT.
    """
    before = process_state(target_pid) if target_pid else None
    env = {**os.environ, "RUST_BACKTRACE": "0", "PYTHONWARNINGS": "ignore"}
    t0 = time.monotonic()
    with lifecycle.held_signals() as held:  # a Ctrl-C while it starts is raised in the try, which stops it
        proc = held.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            held.release()
            out, err = proc.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.send_signal(signal.SIGTERM)  # py-spy and gdb detach cleanly on TERM
            try:
                out, err = proc.communicate(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
        except KeyboardInterrupt:  # the tool is in a session of its own, out of the terminal's Ctrl-C: stop it
            # and whatever it started (gdb forks helpers); a tool that ended as the Ctrl-C came has no group left,
            # which must not turn the interrupt into an error that loses what was read before
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            _resume(target_pid, before)
            raise
    seconds = time.monotonic() - t0
    _resume(target_pid, before)
    return ToolRun(rc=None if timed_out else proc.returncode, stdout=out or "", stderr=err or "",
                   seconds=seconds, timed_out=timed_out)


def _resume(target_pid: int | None, before: str | None) -> None:
    """SIGCONT to a target that a stopped tracer left in state T (it was running before)."""
    if target_pid and before not in ("T", "t") and process_state(target_pid) in ("T", "t"):
        try:
            os.kill(target_pid, signal.SIGCONT)
        except OSError:
            pass


def first_error_line(stderr: str) -> str:
    """The line that says what went wrong, without Rust/Python backtraces or emoji decoration.

    A Python traceback (pystack's) says it after its frames: the exception line (`RuntimeError: ...`),
    the first unindented line after the last `Traceback (most recent call last):`."""
    lines = stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if starts:
        lines = [line for line in lines[starts[-1] + 1:] if line.strip() and not line[0].isspace()] or lines
    for raw in lines:
        line = raw.strip().strip("💀").strip()
        if not line or line.startswith(("Stack backtrace", "Caused by", "Traceback")):
            continue
        if line.startswith("Error: "):
            line = line[len("Error: "):]
        return line[:300]
    return "no error message"
