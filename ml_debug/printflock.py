"""Non-interleaved prints from many processes on one node.

Use it as a drop-in for ``print`` in code that runs as many ranks::

    from ml_debug.printflock import printflock as print
    print("loss", loss, flush=True)

or ``from ml_debug import printflock; printflock("hello")`` (the module is callable).

Each call formats its whole text first, then takes an exclusive ``flock`` on a node-local lock
file, writes AND flushes the text, and only then releases the lock, so a line is never split
by another process even when stdout is a pipe (srun, ``torchrun --tee``) and the text is larger
than the pipe's atomic write size. The lock file lives in /dev/shm (or the temp dir), never next
to this module (which may sit on a read-only or shared filesystem); set it with ``lock_path=`` or
``MLDEBUG_PRINTFLOCK_PATH``. ``prefix=True`` (or ``MLDEBUG_PRINTFLOCK_PREFIX=1``) starts every
line with ``[host:rank]``. Safe across ``fork`` and threads. Standard library only.

Otherwise it behaves as the builtin ``print``: ``file=`` only needs ``write()`` (``flush()`` is
called when the object has one, and required only with ``flush=True``), and a bad ``sep``, ``end``
or keyword raises print's own exception with print's own message. Two differences, both on
purpose: the text goes out in one ``write()`` call rather than one per piece, and when an
argument's ``str()`` raises, nothing at all is written.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import os
import socket
import stat
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterator
from typing import Any, NoReturn, Protocol, cast

from ml_debug.core.rankvars import rank_from_env

__all__ = ["printflock", "default_lock_path", "rank_label"]

ENV_PATH = "MLDEBUG_PRINTFLOCK_PATH"
ENV_PREFIX = "MLDEBUG_PRINTFLOCK_PREFIX"
ENV_TIMEOUT = "MLDEBUG_PRINTFLOCK_TIMEOUT"


class SupportsWrite(Protocol):
    """What ``file=`` must be: an object with ``write(str)``, as for builtin print."""

    def write(self, text: str, /) -> object: ...


class _Discard:
    def write(self, text: str, /) -> int:
        return len(text)


_DISCARD = _Discard()


def default_lock_path() -> str:
    """Node-local lock file: $MLDEBUG_PRINTFLOCK_PATH, else /dev/shm (tmpfs), else the temp dir."""
    explicit = os.environ.get(ENV_PATH)
    if explicit:
        return explicit
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    return os.path.join(base, f"mldebug-printflock-{os.getuid()}.lock")


def rank_label() -> str:
    """``[host:rank]`` for this process, from the launcher's variables ("?" when unknown)."""
    found = rank_from_env()
    rank = "?" if found is None else found[0]
    return f"[{socket.gethostname().split('.')[0]}:{rank}]"


class _Lock:
    """A flock on one path, per process: reopened after fork, serialised across threads.

    flock belongs to the open file description, which a forked child shares with its parent and
    which threads share with each other; so the fd is reopened in a new process and a thread lock
    sits in front of it.
    """

    def __init__(self) -> None:
        self._thread_lock = threading.Lock()
        self._fds: dict[str, int] = {}
        self._pid = os.getpid()

    def _after_fork(self) -> None:
        self._thread_lock = threading.Lock()
        self._fds = {}  # inherited fds stay open for the parent; leaking them in the child is harmless
        self._pid = os.getpid()

    def _fd(self, path: str) -> int:
        if self._pid != os.getpid():
            self._after_fork()
        fd = self._fds.get(path)
        if fd is None:
            fd = _open_lock(path)
            self._fds[path] = fd
        return fd

    @contextlib.contextmanager
    def held(self, path: str, timeout: float) -> Iterator[None]:
        with self._thread_lock:
            fd = self._fd(path)
            locked = _acquire(fd, timeout)
            try:
                yield
            finally:
                if locked:
                    fcntl.flock(fd, fcntl.LOCK_UN)


def _open_lock(path: str) -> int:
    """The lock file's fd, or -1 (print unlocked) when the path is not a plain file of ours or root's.

    The default path is in a world-writable directory: another user may have planted a link there (we
    would create or lock the file it points to) or a file of theirs (they could hold the lock forever).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError:
        return -1
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, os.geteuid()):
        os.close(fd)
        return -1
    return fd


def _acquire(fd: int, timeout: float) -> bool:
    """Take the flock; give up after `timeout` s (a holder stuck on a full pipe must not hang us)."""
    if fd < 0:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    deadline = time.monotonic() + timeout
    delay = 0.0001
    while time.monotonic() < deadline:
        time.sleep(delay)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            delay = min(delay * 2, 0.005)
    return False  # print unlocked rather than lose the text or wait forever


_LOCK = _Lock()
os.register_at_fork(after_in_child=_LOCK._after_fork)


def printflock(
    *args: Any,
    sep: str | None = " ",
    end: str | None = "\n",
    file: SupportsWrite | None = None,
    flush: bool = False,
    prefix: bool | None = None,
    lock_path: str | None = None,
    **invalid: NoReturn,
) -> None:
    """``print`` that cannot interleave with other processes of this node using the same lock.

    The text is flushed inside the lock whenever ``file`` has ``flush()``; ``flush=True``
    additionally requires it, as in print. Checks run in print's order (unknown keyword, then
    ``sys.stdout``, then ``sep``, then ``end``); a failing check is handed to builtin print itself
    so the exception and its words are print's, on every Python version.
    """
    if invalid:
        builtins.print(file=_DISCARD, **invalid)
        raise TypeError(f"{next(iter(invalid))!r} is an invalid keyword argument for print()")
    out: SupportsWrite | None
    if file is None:
        try:
            out = sys.stdout
        except AttributeError:
            raise RuntimeError("lost sys.stdout") from None
        if out is None:  # pythonw / closed stdout: print() is a no-op there too
            return
    else:
        out = file
    if not (sep is None or isinstance(sep, str)) or not (end is None or isinstance(end, str)):
        builtins.print(sep=sep, end=end, file=_DISCARD)
        raise TypeError("sep and end must be None or a string")
    write = out.write  # looked up before any str(), as print does: AttributeError for a bad file
    text = (" " if sep is None else sep).join(str(a) for a in args) + ("\n" if end is None else end)
    if prefix if prefix is not None else _env_prefix():
        label = rank_label() + " "
        text = "".join(label + line for line in text.splitlines(keepends=True))
    with _LOCK.held(lock_path or default_lock_path(), _timeout()):
        write(text)
        # The flush inside the lock is what keeps a buffered file from letting this text out
        # after another process's. print needs only write(): a missing flush() is an error only
        # when flush=True asks for it, and then, as in print, after the text is written.
        if flush or hasattr(out, "flush"):
            cast(Any, out).flush()


DEFAULT_TIMEOUT = 60.0
_TRUE_WORDS = ("1", "true", "t", "yes", "y", "on")  # what `--json`'s MLDEBUG_JSON reads as on (click's words)


def _env_prefix() -> bool:
    """MLDEBUG_PRINTFLOCK_PREFIX read as mldebug reads its other switches: `false`, `no`, `off` are off."""
    return os.environ.get(ENV_PREFIX, "").strip().lower() in _TRUE_WORDS


def _timeout() -> float:
    """MLDEBUG_PRINTFLOCK_TIMEOUT, or the default when it is not a number of seconds (a print must not
    raise over a setting: the job would fail at its first print)."""
    try:
        value = float(os.environ.get(ENV_TIMEOUT, DEFAULT_TIMEOUT))
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if 0 <= value < float("inf") else DEFAULT_TIMEOUT


class _CallableModule(types.ModuleType):
    """Lets ``from ml_debug import printflock; printflock(...)`` work as well."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        printflock(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
