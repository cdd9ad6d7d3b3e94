"""The local transport: run the command here, as a subprocess with a timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable

from ml_debug.core import lifecycle
from ml_debug.remote.result import (
    INTERRUPTED,
    TIMED_OUT,
    UNREACHABLE,
    Interrupted,
    NodeResult,
    decode,
    failed,
    finished,
)
from ml_debug.remote.targets import Target


def shell_argv(script: str) -> list[str]:
    """bash when there is one (``--remote-prefix 'source venv/bin/activate'`` needs it), else sh."""
    for shell in ("/bin/bash", "/usr/bin/bash", "/bin/sh"):
        if os.access(shell, os.X_OK):
            return [shell, "-c", script]
    return ["sh", "-c", script]


def run_process(label: str, argv: list[str], timeout_s: float,
                env: dict[str, str] | None = None) -> NodeResult:
    """Run argv with a deadline; on timeout kill its whole process group (children too)."""
    t0 = time.monotonic()
    with lifecycle.held_signals() as held:  # a Ctrl-C while it starts is raised in the try, which stops it
        try:
            proc = held.popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, start_new_session=True, env=env)
        except OSError as e:
            return failed(label, UNREACHABLE, f"cannot start {argv[0]}: {e.strerror or e}", time.monotonic() - t0)
        try:
            held.release()
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            return failed(label, TIMED_OUT, f"still running after {timeout_s:g} s; killed",
                          time.monotonic() - t0, stdout=decode(out), stderr=decode(err))
        except KeyboardInterrupt:  # stop it, and keep what it printed
            _kill_group(proc)
            try:
                out, err = proc.communicate(timeout=5)  # what the pipes still hold (a process outside the group may hold them)
            except subprocess.TimeoutExpired as e:
                out, err = e.output or b"", e.stderr or b""
            raise Interrupted([failed(label, INTERRUPTED, "stopped by Ctrl-C", time.monotonic() - t0,
                                      stdout=decode(out), stderr=decode(err))]) from None
        except BaseException:
            _kill_group(proc)
            proc.wait()
            raise
    return finished(label, proc.returncode, decode(out), decode(err), time.monotonic() - t0)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def run_local(target: Target, script: str, timeout_s: float,
              deliver: Callable[[NodeResult], None]) -> None:
    """``sh -c SCRIPT`` on this machine."""
    deliver(run_process(target.label, shell_argv(script), timeout_s))
