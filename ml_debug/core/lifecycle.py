"""How an mldebug process ends: one rule for Ctrl-C and SIGTERM, and children that die with it.

The rule (docs/conventions.md, "Signals"): in the process a person or a script started, SIGINT (Ctrl-C)
and SIGTERM (what `kill`, `timeout` and `scancel` send first) both interrupt the command: it stops what
it started, keeps and prints what it gathered, and exits 130 saying which signal it was. The same signal
again within :data:`SAME_SIGNAL_S` of the first is the same one delivered twice, not a second interruption:
`timeout -s INT` signals the process, then its group; a parent-death signal comes once per thread of the
dying parent (below).

A process that mldebug starts and that must not outlive it (a self-launched rank, `mldebug launch`'s
torchrun, the commands `check` and `drill` run) is tied to it with Linux's parent-death signal
(``prctl(PR_SET_PDEATHSIG)``): a SIGKILL of the launcher, which no handler sees, still ends them. The kernel
sends it as the thread that started the child ends, then again each time the child, handed to another thread
of the same process, loses that one too: a parent of N threads killed at once may send it N times (measured:
1 to 3 SIGTERMs from a parent of 6 threads). A child that is not mldebug and cannot take a second one is
started from a process with one thread (``mldebug launch``: torchrun).

A child that mldebug stops when interrupted is started inside :func:`held_signals`: an interrupt that
comes while ``subprocess.Popen`` runs, after the fork, would otherwise raise before mldebug holds the
child, which would then run on after mldebug ends.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from ml_debug.core import testhooks

SAME_SIGNAL_S = 1.0
PR_SET_PDEATHSIG = 1
PARENT_ENV = "MLDEBUG_DIE_WITH_PARENT"
"""Set by mldebug in the environment of a child that must die with it: ``<parent pid>:<signal number>``."""

_last: list[tuple[int, float]] = [(0, -SAME_SIGNAL_S)]
_received: list[int] = []


def interrupting_signal() -> str:
    """The name of the signal that interrupted this command: 'SIGTERM', 'SIGHUP', or 'SIGINT' (Ctrl-C)."""
    return signal.Signals(_received[-1]).name if _received else "SIGINT"


def note(signum: int) -> None:
    """Record the signal that interrupts the command (a handler other than ours caught it: torch's agent)."""
    _received.append(int(signum))


def _interrupt(signum: int, _frame: object) -> None:
    now = time.monotonic()
    last, _last[0] = _last[0], (signum, now)
    if last[0] == signum and now - last[1] < SAME_SIGNAL_S:
        return  # the same signal delivered twice: to the process, then its group; or a parent-death signal again
    note(signum)
    raise KeyboardInterrupt


def install(*, terminate: bool = True) -> None:
    """Ctrl-C and (with ``terminate``) SIGTERM interrupt the command (main thread only). A signal that was
    ignored when we started (nohup, a background job's SIGINT) stays ignored."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)
    if terminate and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)


class HeldSignals:
    """SIGINT and SIGTERM held back in the main thread while a child starts (:func:`held_signals`)."""

    def __init__(self) -> None:
        self._saved: dict[int, Any] = {}
        self.pending: list[int] = []
        """The held signals that came, in order, not yet delivered."""

    def __enter__(self) -> HeldSignals:
        if threading.current_thread() is not threading.main_thread():
            return self  # only the main thread sets handlers, and only it gets KeyboardInterrupt
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                # SIG_IGN (nohup) and SIG_DFL stay: nothing raises there; any Python handler is held, ours
                # or not (torch's agent), and gets the signal afterwards
                if callable(signal.getsignal(sig)):
                    self._saved[sig] = signal.signal(sig, self._record)
        except BaseException:  # a signal that came before the child: delivered now, nothing started yet
            self._put_back()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def popen(self, *args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen(*args, **kwargs)``, the signals still held after it returns."""
        proc = subprocess.Popen(*args, **kwargs)
        testhooks.call(testhooks.CHILD_STARTED, pid=proc.pid, argv=proc.args)
        return proc

    def release(self) -> None:
        """Put the handlers back and deliver the signals that came, each as it would have been delivered
        then (``_interrupt`` raises KeyboardInterrupt, or passes over the same Ctrl-C twice). Call it first
        thing in the ``try`` whose ``except`` stops the child; the end of the block calls it too."""
        self._put_back()
        pending, self.pending = self.pending, []
        for sig in pending:  # after a KeyboardInterrupt, the rest would only interrupt the stopping
            signal.raise_signal(sig)

    def _record(self, signum: int, _frame: object) -> None:
        self.pending.append(int(signum))

    def _put_back(self) -> None:
        # signal.signal() first runs the handlers of signals that came: a held one is recorded, one already
        # put back may raise; the handler is then not changed yet, so every one is tried until all are back
        raised: BaseException | None = None
        while self._saved:
            sig, handler = next(iter(self._saved.items()))
            try:
                signal.signal(sig, handler)
            except BaseException as e:
                raised = raised or e
                continue
            del self._saved[sig]
        if raised is not None:
            raise raised


def held_signals() -> HeldSignals:
    """A block in which SIGINT and SIGTERM are recorded instead of raised: start a child that mldebug must
    stop, and hold it where the stop finds it, before an interrupt can land::

        with lifecycle.held_signals() as held:
            proc = held.popen(argv, ...)
            try:
                held.release()  # a Ctrl-C that came while it started raises here, and the child is stopped
                ...
            except KeyboardInterrupt:
                stop(proc)
                raise

    The signals are not blocked (``pthread_sigmask``): a child inherits the blocked mask through fork and
    exec (a ``grep SigBlk /proc/self/status`` started so shows SIGINT and SIGTERM blocked), and an ssh,
    srun or py-spy that ignores SIGTERM could not be stopped. Only a Python handler is replaced, and only
    in the main thread (elsewhere the block changes nothing); the child gets the default handlers at exec.
    """
    return HeldSignals()


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


class _Keeper:
    """One thread that lives as long as the process and starts the tied children of other threads.

    The kernel sends the parent-death signal when the *thread* that forked the child ends, not the process
    (prctl(2)): a child that a short-lived thread starts and leaves running (a `top` stream's srun, started by
    the thread that connects it) would be killed as that thread returns. Started from here, it is killed when
    the process ends, as meant."""

    def __init__(self) -> None:
        import queue

        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Any]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def run(self, start: Callable[[], Any]) -> Any:
        from concurrent.futures import Future

        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="mldebug-tied-children", daemon=True)
                self._thread.start()
        done: Future[Any] = Future()
        self._jobs.put((start, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            start, done = self._jobs.get()
            try:
                done.set_result(start())
            except BaseException as e:  # noqa: BLE001 - handed to the thread that asked
                done.set_exception(e)


_keeper = _Keeper()


def popen_tied(argv: list[str], sig: int = signal.SIGTERM, held: HeldSignals | None = None,
               **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(argv, **kwargs)`` of a child that gets ``sig`` when this process dies, even by
    SIGKILL (:func:`tie_to_this_process`). From the main thread, through ``held`` when given (its signals held
    while the child starts); from any other thread, started by a thread that lives as long as the process
    (the signal follows the thread that forked)."""
    kwargs["preexec_fn"] = tie_to_this_process(sig)
    if threading.current_thread() is threading.main_thread():
        return held.popen(argv, **kwargs) if held is not None else subprocess.Popen(argv, **kwargs)
    return _keeper.run(lambda: subprocess.Popen(argv, **kwargs))


def alive(pid: int) -> bool:
    """Whether process `pid` still runs: it exists and is not a zombie (one that ended and waits for its
    parent to reap it, which signal 0 still reaches)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
