"""Standard streams fit for mldebug to use, whatever it was started with.

A command is run from scripts, cron, Slurm prologs and systemd units, where its streams can be odd:

- closed (``mldebug ... >&-``, ``<&-``): Python then has ``sys.stdout = None``, and the first file mldebug
  opens would take descriptor 1 and receive the output. A closed standard descriptor is opened on
  ``/dev/null`` first, so what would have gone there goes nowhere, as when nobody reads;
- ASCII-only (``PYTHONIOENCODING=ascii``, an old locale): a job's ``é`` in a log line cannot be encoded.
  Such characters are written as ``\\xe9`` (``backslashreplace``) instead of ending the command; JSON is
  ASCII already;
- unwritable (``> /dev/full``, a full disk, a dead terminal): a write that fails is one error line on
  stderr and exit 3 (:class:`OutputLost`), not an internal error; the rest of the output goes nowhere.
  A reader that went away (``| head -1``) stays what it was: a ``BrokenPipeError`` the app answers quietly.
"""

from __future__ import annotations

import errno
import io
import os
import sys

from ml_debug.core.errors import EnvironmentProblem


class OutputLost(EnvironmentProblem):
    """Standard output cannot be written (exit 3)."""


class _Stdout(io.RawIOBase):
    """Descriptor 1, whose failed writes are :class:`OutputLost` (the descriptor then points at /dev/null,
    so that the error line, an error document and the flush at exit do not fail again)."""

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return 1

    def isatty(self) -> bool:
        return os.isatty(1)

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        try:
            return os.write(1, data)
        except BrokenPipeError:
            # the reader went away: what is still buffered goes nowhere, and the flush at exit must not fail
            # again (Python would then end with 120 after the command chose its own exit code)
            _to_devnull(1, os.O_WRONLY)
            raise
        except OSError as e:
            _to_devnull(1, os.O_WRONLY)
            raise OutputLost(f"cannot write to standard output: {e.strerror or e}",
                             "the output goes to a full disk or a device that refuses it: send it elsewhere "
                             "(another file system, a pipe)") from None


def _to_devnull(fd: int, mode: int) -> None:
    null = os.open(os.devnull, mode | os.O_CLOEXEC)
    if null != fd:
        os.dup2(null, fd, inheritable=True)
        os.close(null)
    else:
        os.set_inheritable(fd, True)


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
        return False
    except OSError as e:
        return e.errno == errno.EBADF


def prepare() -> None:
    """Make the standard streams usable (see the module's docstring); called once as the command starts."""
    for fd, mode in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY)):
        if _closed(fd):
            _to_devnull(fd, mode)
    if sys.stdin is None:
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's stdin, for its whole life
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False, errors="backslashreplace")  # noqa: SIM115
    elif isinstance(sys.stderr, io.TextIOWrapper):
        sys.stderr.reconfigure(errors="backslashreplace")
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    tty = os.isatty(1)
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(_Stdout()), encoding=encoding, errors="backslashreplace",
                                  line_buffering=tty, write_through=False)
