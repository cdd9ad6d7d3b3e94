"""Run a short helper command (a tool's ``--version``, ``squeue``, a user's ``--on-incident`` script)
with a time limit that holds.

``subprocess.run(timeout=...)`` kills only the command it started. When that command is a wrapper (a
pyenv or environment-module shim, a shell script), its children live on, keep the output pipes open,
and the caller then waits for them anyway; Ctrl-C leaves them behind too. Here the command runs in a
process group of its own, and at the time limit, or when the caller is interrupted, the whole group
is killed. And when the caller dies without a chance to (SIGKILL), the command gets SIGTERM from the kernel
(``PR_SET_PDEATHSIG``, see :mod:`ml_debug.core.lifecycle`): a user's ``--on-incident`` script never runs on
with parent 1 after the ``mldebug watch`` that started it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence

from ml_debug.core import lifecycle

_live: set[int] = set()  # process groups of commands still running (threads may run several at once)
_lock = threading.Lock()


def run(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Like ``subprocess.run(argv, capture_output=True, text=True, stdin=DEVNULL, timeout=timeout)``,
    but the command's whole process group is gone when this returns or raises
    (``subprocess.TimeoutExpired``, ``OSError``, ``KeyboardInterrupt``)."""
    with lifecycle.held_signals() as held:  # a Ctrl-C while it starts is raised in the try, which kills it
        # the tie fires when the thread that started the command ends: this one, which waits for it below
        proc = held.popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=None if env is None else dict(env), start_new_session=True,
                          preexec_fn=lifecycle.tie_to_this_process(signal.SIGTERM))
        with _lock:
            _live.add(proc.pid)
        try:
            held.release()
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise subprocess.TimeoutExpired(list(argv), timeout) from None
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            with _lock:
                _live.discard(proc.pid)
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def kill_all() -> None:
    """Kill every command still running under :func:`run` (other threads' too): on Ctrl-C."""
    with _lock:
        groups = list(_live)
    for pgid in groups:
        _signal_group(pgid)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    _signal_group(proc.pid)
    try:
        proc.communicate(timeout=2)  # the pipes close once the group is gone
    except subprocess.TimeoutExpired:  # a child that left the group still holds them: stop reading
        proc.wait()


def _signal_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
