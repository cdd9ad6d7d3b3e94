"""Small input files a user names (a hostfile, an ssh config, a key): read whole, but only when they are
regular files of a bounded size.

``--hosts /dev/zero`` once grew to 7 GB in 16 s, and ``--hosts FIFO`` waited forever for a writer. Here a
FIFO is opened without waiting (O_NONBLOCK) and refused, like a device, a socket or a directory, and a
file larger than its cap is refused with its size and the cap; the errors say what the path is (a loop
of links, a name too long) instead of "does not exist".
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable

from ml_debug.core.errors import UsageError


def what_it_is(mode: int) -> str:
    """'a FIFO (named pipe)', 'a character device', ... for a file mode that is not a regular file."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def why_not(e: OSError) -> str:
    """An open's failure in words about the path."""
    return {
        errno.ENOENT: "does not exist",
        errno.ELOOP: "is a loop of symbolic links",
        errno.ENAMETOOLONG: "has a name too long for this system",
        errno.EACCES: "is not readable by this user",
        errno.ENOTDIR: "does not exist (a part of its path is not a directory)",
        errno.ENXIO: "is a socket or a device with nothing behind it",
        errno.EISDIR: "is a directory",
    }.get(e.errno or 0, f"cannot be read ({e.strerror or e})")


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def open_regular(path: str | os.PathLike[str], refuse: Callable[[int], Exception] | None = None
                 ) -> tuple[int, os.stat_result]:
    """``path`` opened to read without waiting (O_NONBLOCK: a FIFO is refused, not waited on for a writer),
    and its status; OSError when it cannot be opened. Not a regular file: its descriptor is closed and
    ``refuse(its mode)`` raised (by default an OSError that says so)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refuse(st.st_mode) if refuse else OSError(f"{os.fspath(path)} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular(path: str | os.PathLike[str], what: str, limit: int, hint: str) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes; UsageError (exit 2) otherwise,
    naming ``what`` ("hostfile", "ssh config") and the path."""
    shown = os.fspath(path)

    def refuse(mode: int) -> UsageError:
        return UsageError(f"{what} {shown!r} is {what_it_is(mode)}, not a file", hint)

    try:
        fd, st = open_regular(path, refuse)
    except OSError as e:
        raise UsageError(f"{what} {shown!r} {why_not(e)}", hint) from None
    try:
        if st.st_size > limit:
            raise UsageError(f"{what} {shown!r} holds {_size(st.st_size)}, more than a {what} may hold "
                             f"({_size(limit)})", hint)
        chunks: list[bytes] = []
        got = 0
        while got <= limit:  # a file that grows while it is read is still cut at the cap
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise UsageError(f"{what} {shown!r} holds more than a {what} may hold ({_size(limit)})", hint)
        return b"".join(chunks)
    except OSError as e:
        raise UsageError(f"{what} {shown!r} {why_not(e)}", hint) from None
    finally:
        os.close(fd)
