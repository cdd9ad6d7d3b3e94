"""Archives users share a job's files in (``logs.tar.gz``, ``.tgz``, ``.tar``, ``.tar.bz2``, ``.tar.xz``, ``.tar.zst``,
``.tar.lz4``, ``.zip``),
unpacked into a directory to be read as any directory is.

Only the members a caller wants (by name) are written, and only as regular files under the directory: a member's
name is made relative (a leading ``/`` dropped, as GNU tar does) and one that climbs out (``..``) is refused, as are
links and devices. Each file keeps its member's modification time (a log's day, for time stamps without a date).
What cannot be unpacked is said, and what was unpacked before it is kept: a truncated download, a full disk, the
unpacked size past :data:`UNPACK_LIMIT` (a zip bomb too)."""

from __future__ import annotations

import errno
import io
import lzma
import os
import shutil
import stat
import tarfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import IO

from ml_debug.core.lz4frames import Lz4File
from ml_debug.core.zstd import ZstdFile

STREAMED_TAR: dict[str, Callable[[IO[bytes]], io.BufferedIOBase]] = {
    ".tar.zst": ZstdFile, ".tzst": ZstdFile, ".tar.lz4": Lz4File}
"""Tars of a compression tarfile does not know (zstd before Python 3.14, lz4), and their readers: read as a stream."""
TAR = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", *STREAMED_TAR)
ZIP = (".zip",)
UNREADABLE = {".7z": "7z x {path}", ".rar": "unrar x {path}"}
"""Archives of a compression that is not read: how to unpack them."""
UNPACK_LIMIT = 32 << 30
"""Bytes unpacked at most from one archive."""
_BLOCK = 1 << 20


def kind(path: str) -> str | None:
    """``tar``, ``zip``, ``unreadable`` (an archive of another compression, :data:`UNREADABLE`) or None, by name."""
    name = path.lower()
    if name.endswith(TAR):
        return "tar"
    if name.endswith(ZIP):
        return "zip"
    return "unreadable" if name.endswith(tuple(UNREADABLE)) else None


def unpack_hint(path: str) -> str:
    """How to unpack an archive this module cannot read, by hand."""
    how = next((cmd for suffix, cmd in UNREADABLE.items() if path.lower().endswith(suffix)), "unpack it")
    return how.format(path=path)


@dataclass
class Unpacked:
    """Where an archive's wanted members were written, how many, and what was not written (path, reason)."""

    root: str
    files: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)


@dataclass
class _Member:
    name: str
    regular: bool
    link: bool
    mtime: float
    open: Callable[[], IO[bytes]]


def unpack(path: str, into: str, wanted: Callable[[str], bool]) -> Unpacked:
    """The members of the archive at ``path`` whose names ``wanted`` takes, written under the directory ``into``."""
    out = Unpacked(into)
    left = UNPACK_LIMIT
    members = _tar_members(path) if kind(path) == "tar" else _zip_members(path)
    dest = ""
    try:
        for m in members:
            rel = relative(m.name)
            if rel is None or not wanted(rel):
                if rel is None and wanted(os.path.basename(m.name.rstrip("/"))):
                    out.skipped.append({"path": f"{path}/{m.name}", "reason": "its name leads out of the archive's "
                                        "directory (.. or a device path): not unpacked"})
                continue
            if not m.regular:
                out.skipped.append({"path": f"{path}/{rel}", "reason": "a link in the archive (not followed)" if m.link
                                    else "not a regular file"})
                continue
            if left <= 0:
                out.skipped.append({"path": f"{path}/{rel}", "reason": f"past {UNPACK_LIMIT >> 30} GiB unpacked from "
                                    "the archive: unpack it yourself and give the directory"})
                continue
            dest = os.path.join(into, rel)
            try:
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                dst = open(dest, "wb")
            except OSError as e:  # a name taken by another member's directory, too long a name: this member only
                if e.errno == errno.ENOSPC:
                    raise
                out.skipped.append({"path": f"{path}/{rel}", "reason": f"cannot be unpacked: {e.strerror or e}"})
                continue
            with m.open() as src, dst:
                left -= _copy(src, dst, left)
            os.utime(dest, (m.mtime, m.mtime))
            out.files += 1
            dest = ""
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, zlib.error, lzma.LZMAError) as e:
        out.skipped.append({"path": path, "reason": _why(e, out.files)})
        if dest and os.path.isfile(dest) and os.path.getsize(dest) == 0:
            os.remove(dest)  # the member the damage is in, none of it written
    return out


def names(path: str) -> Iterator[str]:
    """The names of the archive's members, in order (a compressed tar is read through once to list them)."""
    for m in _tar_members(path) if kind(path) == "tar" else _zip_members(path):
        yield m.name


def relative(name: str) -> str | None:
    """A member's name as a path under the directory it is unpacked into, or None when it would leave it."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or ".." in parts or ":" in parts[0]:
        return None
    return os.path.join(*parts)


def _copy(src: IO[bytes], dst: IO[bytes], left: int) -> int:
    """Up to ``left`` bytes of ``src`` into ``dst``; how many."""
    done = 0
    while done < left and (chunk := src.read(min(_BLOCK, left - done))):
        dst.write(chunk)
        done += len(chunk)
    return done


def _tar_members(path: str) -> Iterator[_Member]:
    reader = next((r for suffix, r in STREAMED_TAR.items() if path.lower().endswith(suffix)), None)
    if reader is not None:  # a stream of the tar, read once
        with open(path, "rb") as raw, tarfile.open(fileobj=reader(raw), mode="r|") as tar:
            yield from _members_of(tar)
        return
    with tarfile.open(path, "r:*") as tar:
        yield from _members_of(tar)


def _members_of(tar: tarfile.TarFile) -> Iterator[_Member]:
    for info in tar:  # read in order, once: a compressed tar cannot seek back cheaply
        yield _Member(info.name, info.isreg(), info.issym() or info.islnk(), float(info.mtime),
                      partial(_extracted, tar, info))


def _zip_members(path: str) -> Iterator[_Member]:
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            mode = info.external_attr >> 16
            link = stat.S_ISLNK(mode)
            regular = not info.is_dir() and not link and stat.S_IFMT(mode) in (0, stat.S_IFREG)  # 0: no type said
            yield _Member(info.filename, regular, link, time.mktime((*info.date_time, 0, 0, -1)),
                          partial(z.open, info))


def _extracted(tar: tarfile.TarFile, info: tarfile.TarInfo) -> IO[bytes]:
    return tar.extractfile(info) or io.BytesIO()


def _why(e: BaseException, files: int) -> str:
    kept = f" ({files} file(s) before it were read)" if files else ""
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return (f"no space left to unpack it into the temporary directory{kept}: set TMPDIR to a disk with room, or "
                "unpack it yourself and give the directory")
    if isinstance(e, OSError) and not isinstance(e, (tarfile.TarError, zipfile.BadZipFile)):
        return f"cannot read it: {e.strerror or e}{kept}"
    return f"a damaged or truncated archive: {e or type(e).__name__}{kept}"


def remove(root: str) -> None:
    """The directory an archive was unpacked into, removed."""
    shutil.rmtree(root, ignore_errors=True)
