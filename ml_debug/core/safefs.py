"""Files that another user controls, opened by a privileged mldebug without letting that user choose.

mldebug runs as root (or with CAP_SYS_PTRACE) against the jobs of other users and takes paths from
them: environment variables (the Flight Recorder directory, NCCL's pipe and dump files), files in
their directories (trace files, core files). A path like that is untrusted: its owner can make any
part of it a symbolic link, a FIFO or a device, and swap it between our check and our use. Here:

- a path is walked from ``/`` (or from the process's working directory) one component at a time with
  ``openat(O_PATH | O_NOFOLLOW)``; a symbolic link on the way is followed only when root or the job's
  user owns it (like ``/var/run -> /run``, or the job's ``scratch -> /lustre/...``);
- the last component is never followed: a symbolic link there is refused;
- what the walk reaches is checked on the descriptor (``fstat``): its type (a FIFO, a regular file),
  its owner (one of the job's uids) and its size, before it is opened for real through
  ``/proc/self/fd`` (the same inode: nothing can be swapped in between, and a FIFO or a device is
  never opened by mistake, so nothing blocks and nothing has side effects);
- every refusal is a :class:`Refused` whose text is the reason shown in the report.

Files mldebug itself writes (``--out-dir``) are created inside a directory descriptor with
``O_CREAT | O_EXCL | O_NOFOLLOW`` under a random temporary name and renamed into place, so a
symbolic link planted at the final name is replaced, never written through.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import secrets
import stat
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ml_debug.core.visible import visible

MAX_LINKS = 40  # the kernel's own limit on symbolic links in one lookup
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    """A path was not used; ``str(err)`` is the reason, fit for the report."""


@dataclass(frozen=True)
class Owner:
    """Whose files are trusted: the uids/gids of one process (``/proc/PID/status``), or our own."""

    uid: int  # the filesystem uid: who the process creates files as
    gid: int
    uids: frozenset[int]  # real, effective, saved and filesystem uids
    gids: frozenset[int]  # the same gids plus the supplementary groups
    pid: int | None = None

    @classmethod
    def of_process(cls, pid: int) -> Owner | None:
        """The credentials of a live process (None when it is gone or unreadable)."""
        try:
            text = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return None
        fields: dict[str, list[int]] = {}
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in ("Uid", "Gid", "Groups"):
                fields[key] = [int(v) for v in value.split()]
        if len(fields.get("Uid", [])) != 4 or len(fields.get("Gid", [])) != 4:
            return None
        uids, gids = fields["Uid"], fields["Gid"]
        return cls(uid=uids[3], gid=gids[3], uids=frozenset(uids),
                   gids=frozenset(gids + fields.get("Groups", [])), pid=pid)

    @classmethod
    def current(cls) -> Owner:
        """This process (files we created ourselves are ours to trust)."""
        ruid, euid, suid = os.getresuid()
        rgid, egid, sgid = os.getresgid()
        return cls(uid=euid, gid=egid, uids=frozenset({ruid, euid, suid}),
                   gids=frozenset({rgid, egid, sgid, *os.getgroups()}), pid=os.getpid())

    def owns(self, st: os.stat_result) -> bool:
        return st.st_uid in self.uids

    def trusts_link(self, st: os.stat_result) -> bool:
        """A symbolic link on the way to a file: root's (system layout) or the job's own."""
        return st.st_uid == 0 or st.st_uid in self.uids

    def may_write_dir(self, st: os.stat_result) -> bool:
        """Could this user create files in a directory with this mode (root aside)?"""
        if 0 in self.uids:
            return True
        if st.st_uid in self.uids:
            return bool(st.st_mode & stat.S_IWUSR)
        if st.st_gid in self.gids:
            return bool(st.st_mode & stat.S_IWGRP)
        return bool(st.st_mode & stat.S_IWOTH)

    def describe(self) -> str:
        return _who(self.uid)


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _who(uid: int) -> str:
    name = _user(uid)
    return f"uid {uid}" + (f" ({name})" if name != str(uid) else "")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "an unknown kind of file"


_KINDS = {"file": (stat.S_ISREG, "a regular file"), "fifo": (stat.S_ISFIFO, "a FIFO"),
          "dir": (stat.S_ISDIR, "a directory")}


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _close(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def _readlink(name: str, dir_fd: int) -> str:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return "?"


def _walk(parts: deque[str], shown: str, owner: Owner, start_fd: int, create: bool = False) -> int:
    """Resolve directory components from `start_fd` (consumed); an O_PATH fd of the directory reached.

    Symbolic links are followed only when `owner` trusts them; with `create`, missing directories are
    made (``mkdir -p``)."""
    fd = start_fd
    links = 0
    try:
        while parts:
            comp = parts.popleft()
            if comp in ("", "."):
                continue
            try:
                nfd = os.open(comp, _PATH_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create or comp == "..":
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(comp, 0o777, dir_fd=fd)
                nfd = os.open(comp, _PATH_FLAGS, dir_fd=fd)
            st = os.fstat(nfd)
            if stat.S_ISLNK(st.st_mode):
                target = _readlink(comp, fd)
                _close(nfd)
                if not owner.trusts_link(st):
                    raise Refused(f"{shown}: {comp} is a symbolic link (to {target}) owned by {_who(st.st_uid)}, "
                                  f"not by root or {owner.describe()}: not followed")
                links += 1
                if links > MAX_LINKS or target == "?":
                    raise Refused(f"{shown}: too many or unreadable symbolic links")
                if target.startswith("/"):
                    _close(fd)
                    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                parts.extendleft(reversed(target.split("/")))
                continue
            if not stat.S_ISDIR(st.st_mode):
                _close(nfd)
                raise Refused(f"{shown}: {comp} is {_kind(st.st_mode)}, not a directory")
            _close(fd)
            fd = nfd
        return fd
    except BaseException:
        _close(fd)
        raise


def _start(path: str, cwd_fd: int | None) -> int:
    if path.startswith("/"):
        return os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    if cwd_fd is None:
        raise Refused(f"{path} is a relative path and the process's working directory is unknown")
    return os.dup(cwd_fd)


def process_cwd(pid: int) -> int | None:
    """An O_PATH fd of a process's working directory (``/proc/PID/cwd``, the kernel's own link); None if gone."""
    try:
        return os.open(f"/proc/{pid}/cwd", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None


def split(path: str, cwd_fd: int | None, owner: Owner) -> tuple[int, str]:
    """(O_PATH fd of the directory holding the last component, that component) for an untrusted path."""
    parts = path.split("/")
    leaf = parts.pop()
    if leaf in ("", ".", ".."):
        raise Refused(f"{path} does not name a file")
    return _walk(deque(parts), path, owner, _start(path, cwd_fd)), leaf


def open_dir(path: str, owner: Owner, cwd_fd: int | None = None) -> int:
    """An O_PATH fd of an untrusted directory (every component walked as in :func:`split`)."""
    return _walk(deque(path.split("/")), path, owner, _start(path, cwd_fd))


def open_in(dir_fd: int, name: str, shown: str, owner: Owner, kind: str, flags: int,
            max_bytes: int | None = None, any_owner: bool = False) -> tuple[int, os.stat_result]:
    """Open `name` in `dir_fd` only if it is not a link, is of `kind` and belongs to `owner` (unless
    `any_owner`).

    FileNotFoundError passes through (absent is not a refusal); every other reason is :class:`Refused`.
    """
    pfd = os.open(name, _PATH_FLAGS, dir_fd=dir_fd)
    try:
        st = os.fstat(pfd)
        if stat.S_ISLNK(st.st_mode):
            raise Refused(f"{shown} is a symbolic link (to {_readlink(name, dir_fd)}): not followed")
        is_kind, wanted = _KINDS[kind]
        if not is_kind(st.st_mode):
            raise Refused(f"{shown} is {_kind(st.st_mode)}, not {wanted}: not opened")
        if not any_owner and not owner.owns(st):
            raise Refused(f"{shown} belongs to {_who(st.st_uid)}, not to the job's user ({owner.describe()}): "
                          "not used")
        if max_bytes is not None and st.st_size > max_bytes:
            raise Refused(f"{shown} is {size_text(st.st_size)}, over the {size_text(max_bytes)} limit: not read")
        # reopen the very inode just checked (an O_PATH fd cannot read or write)
        fd = os.open(f"/proc/self/fd/{pfd}", flags | os.O_CLOEXEC)
    finally:
        _close(pfd)
    st2 = os.fstat(fd)
    if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
        _close(fd)
        raise Refused(f"{shown} changed while it was being opened: not used")
    return fd, st2


def open_untrusted(path: str, owner: Owner, kind: str, flags: int, *, cwd_fd: int | None = None,
                   max_bytes: int | None = None) -> tuple[int, os.stat_result]:
    """:func:`open_in` for a whole path taken from another user (see the module docstring)."""
    dfd, leaf = split(path, cwd_fd, owner)
    try:
        return open_in(dfd, leaf, path, owner, kind, flags, max_bytes)
    finally:
        _close(dfd)


def read_fd(fd: int, shown: str, max_bytes: int) -> bytes:
    """All of an open file, refusing one that grows past `max_bytes` while we read."""
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > max_bytes:
            raise Refused(f"{shown} is over the {size_text(max_bytes)} limit: not read")


def read_untrusted(path: str, owner: Owner, max_bytes: int, *, cwd_fd: int | None = None
                   ) -> tuple[bytes, os.stat_result]:
    """The bytes of a regular file owned by `owner`, at most `max_bytes` (else :class:`Refused`)."""
    fd, st = open_untrusted(path, owner, "file", os.O_RDONLY | os.O_NONBLOCK, cwd_fd=cwd_fd, max_bytes=max_bytes)
    try:
        return read_fd(fd, path, max_bytes), st
    finally:
        _close(fd)


def open_found(path: str, shown: str | None = None, max_bytes: int | None = None) -> tuple[int, os.stat_result]:
    """Open a regular file found in a directory that another user may control (a job's trace or core file).

    `path` should be absolute with its directories already resolved; a symbolic link on the way is
    followed only when root or we own it, the file itself is never a link, a FIFO or a device, and a
    hard link to a file of another user than the directory's owner is refused (a way to make root
    read someone else's file where hard links to others' files are allowed)."""
    me = Owner.current()
    name = shown or path
    dfd, leaf = split(os.path.abspath(path), None, me)
    with opened(dfd):
        fd, st = open_in(dfd, leaf, name, me, "file", os.O_RDONLY | os.O_NONBLOCK, max_bytes, any_owner=True)
        dir_uid = os.fstat(dfd).st_uid
    if st.st_nlink > 1 and st.st_uid != dir_uid:
        _close(fd)
        raise Refused(f"{name} is a hard link to a file of {_who(st.st_uid)} in a directory of {_who(dir_uid)}: "
                      "not read")
    return fd, st


@contextlib.contextmanager
def opened(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        _close(fd)


# ---- files mldebug writes -------------------------------------------------------------------------

def open_out_dir(path: str | os.PathLike[str], flag: str = "--out-dir") -> int:
    """An O_PATH fd of an output directory, made like ``mkdir -p`` where missing.

    The operator named it, but a shared parent (``/tmp``) lets others plant the name first: a symbolic
    link on the way is followed only when we or root own it, and the directory must be ours or root's.
    `flag` names the option in the error (``--metrics-dir``, ``--log-dir``...).
    """
    from ml_debug.core.errors import UsageError

    text = os.fspath(path)
    me = Owner.current()
    try:
        start = os.open("/" if text.startswith("/") else ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        fd = _walk(deque(text.split("/")), text, me, start, create=True)
    except Refused as e:
        raise UsageError(f"{flag}: {visible(str(e))}", "choose a directory that you own") from None
    except OSError as e:
        raise UsageError(f"{flag} {visible(text)}: {e.strerror}", "choose a writable directory") from None
    return _ours_or_roots(fd, me, f"{flag} {visible(text)} belongs to")


def _ours_or_roots(fd: int, me: Owner, refusal: str) -> int:
    """`fd` when its directory is ours or root's; otherwise it is closed and a usage error starts with `refusal`."""
    from ml_debug.core.errors import UsageError

    st = os.fstat(fd)
    if st.st_uid != 0 and not me.owns(st):
        _close(fd)
        raise UsageError(f"{refusal} {_who(st.st_uid)}: another user could replace what mldebug writes there",
                         "choose a directory that you own")
    return fd


def check_out_dir(path: str | os.PathLike[str], flag: str = "--out-dir") -> None:
    """The checks of :func:`open_out_dir` made now on what exists of the path, without making anything
    (a command that writes only if something happens, like watch): a planted link is said up front."""
    from ml_debug.core.errors import UsageError

    text = os.fspath(path)
    me = Owner.current()
    try:
        start = os.open("/" if text.startswith("/") else ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        fd = _walk(deque(text.split("/")), text, me, start)
    except FileNotFoundError:
        return  # made (and checked again) when it is first written
    except Refused as e:
        raise UsageError(f"{flag}: {visible(str(e))}", "choose a directory that you own") from None
    except OSError as e:
        raise UsageError(f"{flag} {visible(text)}: {e.strerror}", "choose a writable directory") from None
    with opened(fd):
        st = os.fstat(fd)
    if st.st_uid != 0 and not me.owns(st):
        raise UsageError(f"{flag} {visible(text)} belongs to {_who(st.st_uid)}: another user could replace what "
                         "mldebug writes there", "choose a directory that you own")


def make_out_dir(path: str | os.PathLike[str], flag: str = "--out-dir") -> None:
    """An output directory made and checked (:func:`open_out_dir`) before the work, so an unusable one
    is said up front, not after the work is done."""
    os.close(open_out_dir(path, flag))


_claimed: dict[tuple[int, int], int] = {}  # (device, inode) -> the fd that holds it while this process runs


def claim_out_dir(path: str | os.PathLike[str], flag: str = "--out-dir") -> None:
    """:func:`make_out_dir`, and the directory held for this run (an exclusive ``flock`` on the
    directory itself, released when the process ends, however it ends): a second run given the same
    directory while this one runs is refused (exit 2) instead of mixing its files with this run's.
    Runs one after another may share it: the later one replaces the earlier one's files."""
    import fcntl

    from ml_debug.core.errors import UsageError

    fd = open_out_dir(path, flag)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) in _claimed:  # this process holds it already (a second step of one run)
            return
        held = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
    finally:
        _close(fd)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _close(held)
        raise UsageError(f"{flag} {visible(os.fspath(path))} is in use by another mldebug run: the two runs would "
                         "mix their files", "give each run its own directory, e.g. "
                         f"{flag} {visible(os.fspath(path)).rstrip('/')}/$(date +%Y%m%d-%H%M%S)") from None
    _claimed[(st.st_dev, st.st_ino)] = held


def _refuse_device(dir_fd: int, name: str) -> None:
    """A device at `name` is never replaced or removed: no user can plant one (mknod needs root), so it is
    the system's own (`--csv /dev/null`), and replacing it with a file would break the machine."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        raise Refused(f"{name} is {_kind(st.st_mode)}: mldebug writes regular files only and replaces no device")


def replace_in(dir_fd: int, name: str, data: bytes, mode: int = 0o666) -> str | None:
    """Write `name` in a directory atomically, never through a link planted at that name.

    The data goes to a new file with a random name (``O_CREAT|O_EXCL|O_NOFOLLOW``, `mode` less the
    umask) that is renamed over `name`. Returns a note when `name` was something else (a symbolic
    link, a FIFO): it was replaced, not followed.
    """
    _refuse_device(dir_fd, name)
    tmp = f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        _close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    _close(fd)
    note = _replaced_note(dir_fd, name)
    try:
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    return note


def planted(out_dir: str | os.PathLike[str], name: str) -> str | None:
    """What :func:`write_out` would say about ``<out_dir>/<name>`` (a note when it is not a regular file)."""
    fd = open_out_dir(out_dir)
    with opened(fd):
        return _replaced_note(fd, name)


def _replaced_note(dir_fd: int, name: str) -> str | None:
    """The note of a write over `name` (:func:`replace_in`) when something other than a regular file is
    there: what it is, and where a symbolic link led."""
    try:
        old = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISREG(old.st_mode):
        return None
    what = _kind(old.st_mode)
    if stat.S_ISLNK(old.st_mode):
        what += f" (to {_readlink(name, dir_fd)})"
    return f"{name} was {what}: not followed, replaced by the real file"


def write_out(out_dir: str | os.PathLike[str], name: str, data: str | bytes, flag: str = "--out-dir") -> str | None:
    """Write ``<out_dir>/<name>`` (see :func:`replace_in`); a note when a planted file was replaced."""
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"not a plain file name: {name!r}")
    fd = open_out_dir(out_dir, flag)
    try:
        return replace_in(fd, name, data.encode() if isinstance(data, str) else data)
    finally:
        _close(fd)


def open_append(out_dir: str | os.PathLike[str], name: str, flag: str = "--out-dir") -> tuple[int, str | None]:
    """An fd for appending to ``<out_dir>/<name>`` (made 0666 less the umask). What is planted at that
    name is removed first (the name, never what it leads to): a symbolic link, a FIFO, or a regular
    file that is another user's or has other hard links (in a shared directory, a hard link to a file
    of root's would make us append to that file). The fd and a note when that happened."""
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"not a plain file name: {name!r}")
    dfd = open_out_dir(out_dir, flag)
    me = Owner.current()
    note = None
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        for _ in range(3):
            try:
                _refuse_device(dfd, name)
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                what = _planted(st, me)
                if what:
                    if stat.S_ISLNK(st.st_mode):
                        what += f" (to {_readlink(name, dfd)})"
                    os.unlink(name, dir_fd=dfd)
                    note = f"{name} was {what}: removed, not followed"
            except FileNotFoundError:
                pass
            try:
                fd = os.open(name, flags, 0o666, dir_fd=dfd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENXIO, errno.EACCES):
                    continue  # planted again between our look and our open
                raise
            if _planted(os.fstat(fd), me):
                _close(fd)
                continue
            os.set_blocking(fd, True)
            return fd, note
        raise Refused(f"{name} keeps being replaced by something that is not a regular file of yours")
    finally:
        _close(dfd)


def _planted(st: os.stat_result, me: Owner) -> str | None:
    """Why a file found where we append is not ours to append to (None when it is)."""
    if not stat.S_ISREG(st.st_mode):
        return _kind(st.st_mode)
    if not me.owns(st):
        return f"a file of {_who(st.st_uid)}"
    if st.st_nlink > 1:
        return f"a hard link ({st.st_nlink} names)"
    return None


def out_file_dir(flag: str, path: str | os.PathLike[str]) -> int:
    """An O_PATH fd of the directory an output FILE goes in (``--csv``, ``--plot``), by the rules of
    :func:`open_out_dir` (never made: a file's directory must exist). Usage errors name `flag`."""
    from ml_debug.core.errors import UsageError

    text = os.fspath(path)
    parent, _, leaf = text.rpartition("/")
    if leaf in ("", ".", ".."):
        what = "is a directory" if os.path.isdir(text) else "does not name a file"
        raise UsageError(f"{flag} {visible(text)} {what}", "name a file, e.g. results/bench.csv")
    parent = parent or ("/" if text.startswith("/") else ".")
    me = Owner.current()
    try:
        start = os.open("/" if parent.startswith("/") else ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        fd = _walk(deque(parent.split("/")), text, me, start)
    except Refused as e:
        raise UsageError(f"{flag}: {visible(str(e))}", "choose a directory that you own") from None
    except FileNotFoundError:
        raise UsageError(f"{flag} {visible(text)}: directory {visible(parent)} does not exist",
                         "create it first, or choose another path") from None
    except OSError as e:
        raise UsageError(f"{flag} {visible(text)}: {e.strerror}", "choose another path") from None
    return _ours_or_roots(fd, me, f"{flag} {visible(text)}: its directory belongs to")


def check_out_file(flag: str, path: str | os.PathLike[str]) -> None:
    """The checks of :func:`write_file` made before the work (exit 2 up front, not after a long run)."""
    from ml_debug.core.errors import UsageError

    fd = out_file_dir(flag, path)
    with opened(fd):
        leaf = os.fspath(path).rpartition("/")[2]
        try:
            st = os.stat(leaf, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        except OSError as e:  # a name too long for the file system, say
            raise UsageError(f"{flag} {visible(os.fspath(path))}: {e.strerror}", "choose another name") from None
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{flag} {visible(os.fspath(path))} is a directory", "name a file inside it")
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            raise UsageError(f"{flag} {visible(os.fspath(path))} is {_kind(st.st_mode)}: mldebug writes regular "
                             "files only (and never replaces a device)", "name a file, e.g. results/bench.csv")


def write_file(flag: str, path: str | os.PathLike[str], data: str | bytes) -> str | None:
    """Write an output FILE the operator named (``--csv``, ``--plot``): its directory walked as for
    ``--out-dir``, the file replaced atomically by a new one (:func:`replace_in`), so a link planted at
    that name in a shared directory is replaced, never written through. A note when that happened."""
    fd = out_file_dir(flag, path)
    with opened(fd):
        leaf = os.fspath(path).rpartition("/")[2]
        note = replace_in(fd, leaf, data.encode() if isinstance(data, str) else data)
    return f"{flag}: {note}" if note else None


def make_in(dir_fd: int, name: str, mode: int = 0o777) -> int:
    """A new directory `name` inside `dir_fd` made by us (``mkdir``, never through a link; an existing
    directory is used only when it is ours and no link); its O_PATH fd."""
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"not a plain directory name: {name!r}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, mode, dir_fd=dir_fd)
    fd = os.open(name, _PATH_FLAGS, dir_fd=dir_fd)
    st = os.fstat(fd)
    me = Owner.current()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or not me.owns(st):
        what = _kind(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            what += f" (to {_readlink(name, dir_fd)})"
        elif not me.owns(st):
            what += f" of {_who(st.st_uid)}"
        _close(fd)
        raise Refused(f"{name} is {what}: not used")
    return fd


def trusted_system_file(path: str) -> bool:
    """A file that root may source or run: a regular file that root (or we) own, and neither it nor any
    directory above it writable by group or others (``/usr/lib/...``; not a job's venv, not /tmp)."""
    me = os.geteuid()
    try:
        p = os.path.realpath(path)
        if not stat.S_ISREG(os.stat(p).st_mode):
            return False
    except OSError:
        return False
    while True:
        try:
            st = os.lstat(p)
        except OSError:
            return False
        if st.st_uid not in (0, me) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
        parent = os.path.dirname(p)
        if parent == p:
            return True
        p = parent
