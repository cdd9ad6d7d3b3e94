"""How an mldebug process ends: one rule for Ctrl-C and SIGTERM, and children that die with it.

The rule (docs/conventions.md, "Signals"): in the process a person or a script started, SIGINT (Ctrl-C)
and SIGTERM (what `kill`, `timeout` and `scancel` send first) both interrupt the command: it stops what
it started, keeps and prints what it gathered, and exits 130 saying which signal it was. A SIGINT within
:data:`SAME_CTRL_C_S` of the first is the same Ctrl-C delivered twice (`timeout -s INT` signals the process,
then its group) and is not a second interruption.

A process that mldebug starts and that must not outlive it (a self-launched rank, `mldebug launch`'s
torchrun, the commands `check` and `drill` run) is tied to it with Linux's parent-death signal
(``prctl(PR_SET_PDEATHSIG)``): a SIGKILL of the launcher, which no handler sees, still ends them.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable
from typing import Any

SAME_CTRL_C_S = 1.0
PR_SET_PDEATHSIG = 1
PARENT_ENV = "MLDEBUG_DIE_WITH_PARENT"
"""Set by mldebug in the environment of a child that must die with it: ``<parent pid>:<signal number>``."""

_last = [-SAME_CTRL_C_S]
_received: list[int] = []


def interrupting_signal() -> str:
    """The name of the signal that interrupted this command: 'SIGTERM', 'SIGHUP', or 'SIGINT' (Ctrl-C)."""
    return signal.Signals(_received[-1]).name if _received else "SIGINT"


def note(signum: int) -> None:
    """Record the signal that interrupts the command (a handler other than ours caught it: torch's agent)."""
    _received.append(int(signum))


def _interrupt(signum: int, _frame: object) -> None:
    now = time.monotonic()
    last, _last[0] = _last[0], now
    if signum == signal.SIGINT and now - last < SAME_CTRL_C_S:
        return  # the same Ctrl-C, delivered to the process and then to its group
    note(signum)
    raise KeyboardInterrupt


def install(*, terminate: bool = True) -> None:
    """Ctrl-C and (with ``terminate``) SIGTERM interrupt the command (main thread only). A signal that was
    ignored when we started (nohup, a background job's SIGINT) stays ignored."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)
    if terminate and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)


def handlers() -> dict[int, Any]:
    """The handlers of the interrupting signals now (to put back after a library replaced them)."""
    return {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}


def restore(saved: dict[int, Any]) -> None:
    for sig, handler in saved.items():
        if handler is not None:
            signal.signal(sig, handler)


def _prctl() -> Callable[..., int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):  # not Linux
        return None


def die_with_parent(sig: int, parent: int | None = None) -> bool:
    """Have the kernel send ``sig`` to this process when its parent dies. When the parent (pid ``parent``)
    is already gone, send it now. False where the kernel has no such thing."""
    prctl = _prctl()
    if prctl is None or prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if parent is not None and os.getppid() != parent:  # it died before the prctl: nobody would signal us
        os.kill(os.getpid(), sig)
    return True


def child_env(sig: int = signal.SIGTERM) -> dict[str, str]:
    """Environment for an mldebug child process that must end (with ``sig``) when this process ends."""
    return {PARENT_ENV: f"{os.getpid()}:{int(sig)}"}


def adopt_parent_tie() -> None:
    """In a child started with :func:`child_env`: arm the parent-death signal. The variable is removed, so
    that this process's own children are tied to it, not to its parent."""
    value = os.environ.pop(PARENT_ENV, "")
    pid, _, sig = value.partition(":")
    if pid.isdigit() and sig.isdigit():
        die_with_parent(int(sig), int(pid))


def tie_to_this_process(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` for a child that is not mldebug (torchrun): it gets ``sig`` when we die. The libc
    function is looked up now, before the fork, so the child only makes one C call."""
    prctl = _prctl()
    parent = os.getpid()

    def tie() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
            if os.getppid() != parent:
                os.kill(os.getpid(), sig)

    return tie


def alive(pid: int) -> bool:
    """Whether process `pid` still runs: it exists and is not a zombie (one that ended and waits for its
    parent to reap it, which signal 0 still reaches)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
