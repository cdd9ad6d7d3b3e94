"""A snapshot of this node's process table (`ps -eo pid,ppid,user,args`), read from /proc."""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ProcInfo:
    pid: int
    ppid: int
    uid: int
    user: str
    state: str  # R S D Z T ... from /proc/PID/stat
    cmdline: list[str]
    exe: str | None  # readlink /proc/PID/exe (None: gone, kernel thread, or no permission)
    name: str  # comm


@dataclass
class ProcTable:
    procs: dict[int, ProcInfo] = field(default_factory=dict)
    children: dict[int, list[int]] = field(default_factory=dict)

    def descendants(self, pid: int) -> list[int]:
        out: list[int] = []
        stack = list(self.children.get(pid, []))
        while stack:
            child = stack.pop()
            out.append(child)
            stack.extend(self.children.get(child, []))
        return out

    def ancestors(self, pid: int) -> list[int]:
        out: list[int] = []
        seen = {pid}
        info = self.procs.get(pid)
        while info is not None and info.ppid not in seen and info.ppid > 0:
            out.append(info.ppid)
            seen.add(info.ppid)
            info = self.procs.get(info.ppid)
        return out


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def read_proc(pid: int) -> ProcInfo | None:
    """One process from /proc, or None when it is gone."""
    base = Path(f"/proc/{pid}")
    try:
        stat = (base / "stat").read_text()
        # comm may hold spaces and parentheses: split at the last ')'
        name = stat[stat.index("(") + 1: stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2:].split()
        state, ppid = rest[0], int(rest[1])
        uid = os.stat(base).st_uid
        raw = (base / "cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return None
    cmdline = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    try:
        exe: str | None = os.readlink(base / "exe")
    except OSError:
        exe = None
    return ProcInfo(pid=pid, ppid=ppid, uid=uid, user=_user(uid), state=state, cmdline=cmdline, exe=exe,
                    name=name)


def snapshot() -> ProcTable:
    """Every process visible in this PID namespace."""
    table = ProcTable()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        info = read_proc(int(entry))
        if info is None:
            continue
        table.procs[info.pid] = info
        table.children.setdefault(info.ppid, []).append(info.pid)
    for kids in table.children.values():
        kids.sort()
    return table


def process_state(pid: int) -> str | None:
    """The one-letter state of a process (`ps -o stat`), None when it no longer exists."""
    info = read_proc(pid)
    return info.state if info is not None else None


def pids_with_env(var: str, value: str) -> list[int]:
    """Live processes (not zombies) whose environment holds ``var=value``, this one excepted: the
    processes something started with a marker of its own, wherever they run now (own sessions, other
    PID namespaces on this node)."""
    needle = f"{var}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if needle in env and state not in (b"Z", b"X"):
            found.append(int(entry))
    return found
