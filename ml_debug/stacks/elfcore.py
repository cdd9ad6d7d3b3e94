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


def is_core(path: Path) -> bool:
    """An ELF file of type ET_CORE."""
    try:
        with open(path, "rb") as f:
            head = f.read(18)
    except OSError:
        return False
    if len(head) < 18 or head[:4] != b"\x7fELF":
        return False
    endian = "<" if head[5] == 1 else ">"
    return struct.unpack(endian + "H", head[16:18])[0] == ET_CORE


def _signame(num: int | None) -> str | None:
    if not num:
        return None
    try:
        return _signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def read_notes(path: Path) -> CoreNotes:
    """Parse the PT_NOTE segments of a 64-bit little-endian core (x86_64, aarch64)."""
    notes = CoreNotes()
    with open(path, "rb") as f:
        ident = f.read(64)
        if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
            return notes  # only ELF64 LE is read; gdb still works on the others
        e_phoff, = struct.unpack_from("<Q", ident, 32)
        e_phentsize, e_phnum = struct.unpack_from("<HH", ident, 54)
        f.seek(e_phoff)
        phdrs = f.read(e_phentsize * e_phnum)
        for i in range(e_phnum):
            p_type, _flags, p_offset, _va, _pa, p_filesz = struct.unpack_from("<IIQQQQ", phdrs, i * e_phentsize)
            if p_type != PT_NOTE:
                continue
            f.seek(p_offset)
            _parse_notes(f.read(min(p_filesz, 64 << 20)), notes)
    return notes


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
