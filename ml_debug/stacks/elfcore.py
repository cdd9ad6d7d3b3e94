"""Read what a core file says about itself (`eu-readelf -n core`): pid, signal, command line and
the executable, from its ELF notes. Pure Python, no gdb needed."""

from __future__ import annotations

import os
import shutil
import signal as _signal
import struct
from dataclasses import dataclass, field
from pathlib import Path

NT_PRSTATUS = 1
NT_PRPSINFO = 3
NT_FILE = 0x46494C45
ET_CORE = 4
PT_NOTE = 4


@dataclass
class CoreNotes:
    pid: int | None = None
    signal: int | None = None
    signal_name: str | None = None
    fname: str | None = None  # the comm name (16 bytes)
    psargs: str | None = None  # the first 80 bytes of the command line
    files: list[str] = field(default_factory=list)  # mapped files, executable first
    threads: int = 0
    file_end: int = 0  # where the last segment's bytes end: a core file shorter than this was cut off


def _open(path: Path) -> int:
    """A read fd of a regular file, never opening a FIFO or a device (no block, no side effect)."""
    from ml_debug.core.safefs import Refused, open_found

    try:
        return open_found(os.path.abspath(path))[0]
    except Refused as e:
        raise OSError(str(e)) from None


def is_core_fd(fd: int) -> bool:
    """An ELF file of type ET_CORE (reads the first 18 bytes of an open file)."""
    head = os.pread(fd, 18, 0)
    if len(head) < 18 or head[:4] != b"\x7fELF":
        return False
    endian = "<" if head[5] == 1 else ">"
    return struct.unpack(endian + "H", head[16:18])[0] == ET_CORE


def is_core(path: Path) -> bool:
    """An ELF file of type ET_CORE (False for anything that is not a regular file: a link, a FIFO)."""
    try:
        fd = _open(path)
    except OSError:
        return False
    try:
        return is_core_fd(fd)
    finally:
        os.close(fd)


def _signame(num: int | None) -> str | None:
    if not num:
        return None
    try:
        return _signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


MAX_NOTES_BYTES = 64 << 20  # all PT_NOTE segments together; a crafted core must not exhaust memory


def read_notes(path: Path) -> CoreNotes:
    """Parse the PT_NOTE segments of a 64-bit little-endian core (x86_64, aarch64)."""
    fd = _open(path)
    try:
        return read_notes_fd(fd)
    finally:
        os.close(fd)


class BadCore(ValueError):
    """A core whose headers do not fit the file (crafted or corrupt); ``str(err)`` says which field."""


MAX_OFFSET = 1 << 62  # no real file is larger; a field beyond it is garbage, not a size to add up


def read_notes_fd(fd: int) -> CoreNotes:
    """:func:`read_notes` of an open file. Every offset and size comes from the file: each is checked
    against the file's size before use (:class:`BadCore` when the program headers do not fit)."""
    notes = CoreNotes()
    size = os.fstat(fd).st_size
    ident = os.pread(fd, 64, 0)
    if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
        return notes  # only ELF64 LE is read; gdb still works on the others
    e_phoff, = struct.unpack_from("<Q", ident, 32)
    e_phentsize, e_phnum = struct.unpack_from("<HH", ident, 54)
    if e_phentsize != 56:  # sizeof(Elf64_Phdr)
        return notes
    if e_phoff >= size:
        raise BadCore(f"its program headers (at offset {e_phoff}) lie beyond its end ({size} bytes): "
                      "a corrupt or crafted core")
    # only the headers that the file holds (a core cut short still goes to gdb, which shows what is left)
    phdrs = os.pread(fd, min(e_phentsize * e_phnum, size - e_phoff), e_phoff)
    budget = MAX_NOTES_BYTES
    for i in range(len(phdrs) // e_phentsize):
        p_type, _flags, p_offset, _va, _pa, p_filesz = struct.unpack_from("<IIQQQQ", phdrs, i * e_phentsize)
        if p_offset > MAX_OFFSET or p_filesz > MAX_OFFSET:
            raise BadCore(f"program header {i} names offset {p_offset} and size {p_filesz}: a corrupt or crafted "
                          "core")
        notes.file_end = max(notes.file_end, p_offset + p_filesz)
        if p_type != PT_NOTE or budget <= 0 or p_offset >= size:
            continue  # a note past the end: a truncated core (said by truncation())
        data = os.pread(fd, min(p_filesz, budget, size - p_offset), p_offset)
        budget -= len(data)
        _parse_notes(data, notes)
    return notes


def truncation(notes: CoreNotes, size: int) -> str | None:
    """Why a core of `size` bytes is incomplete (a full disk, a core limit, a copy cut short), or None.

    A cut-off core still opens in gdb, which then shows a stack of ``??`` from memory that is not there."""
    if notes.file_end <= size:
        return None
    return (f"core file truncated: {size} of the {notes.file_end} bytes its program headers describe "
            "(disk full, ulimit -c, or an interrupted copy): frames may be missing or wrong")


def _parse_notes(data: bytes, notes: CoreNotes) -> None:
    off = 0
    while off + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from("<III", data, off)
        off += 12
        name = data[off:off + namesz].rstrip(b"\0")
        off += (namesz + 3) & ~3
        desc = data[off:off + descsz]
        off += (descsz + 3) & ~3
        if name != b"CORE":
            continue
        if ntype == NT_PRSTATUS and len(desc) >= 36:
            notes.threads += 1
            if notes.pid is None:  # the first thread is the one that took the signal
                notes.signal = struct.unpack_from("<h", desc, 12)[0] or struct.unpack_from("<i", desc, 0)[0]
                notes.signal_name = _signame(notes.signal)
                notes.pid = struct.unpack_from("<i", desc, 32)[0]
        elif ntype == NT_PRPSINFO and len(desc) >= 136:
            notes.fname = desc[40:56].split(b"\0", 1)[0].decode(errors="replace")
            notes.psargs = desc[56:136].split(b"\0", 1)[0].decode(errors="replace").strip()
        elif ntype == NT_FILE and len(desc) >= 16:
            count, _page = struct.unpack_from("<QQ", desc, 0)
            count = min(count, (len(desc) - 16) // 24)  # entries that fit the note, not what it claims
            names = desc[16 + count * 24:].split(b"\0")
            seen: list[str] = []
            for raw in names[:count]:
                name_s = raw.decode(errors="replace")
                if name_s and name_s not in seen:
                    seen.append(name_s)
            notes.files = seen


def executable_of(notes: CoreNotes) -> str | None:
    """The program that dumped this core: the first mapped file, else argv[0] on PATH."""
    for candidate in notes.files[:1]:
        if os.path.isfile(candidate):
            return candidate
    if notes.psargs:
        argv0 = notes.psargs.split()[0]
        if os.path.isfile(argv0):
            return argv0
        found = shutil.which(argv0)
        if found:
            return found
    if notes.fname:
        return shutil.which(notes.fname)
    return None
