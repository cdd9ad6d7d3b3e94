"""What a node and its processes are doing, read straight from /proc (what `top` and `free` read).

Each reader is one or two small file reads, so an agent can sample every second at a cost that
does not show up in its own node's `top`. CPU percentages are differences between two readings;
:class:`CpuMeter` keeps the previous ones.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass
class ProcSample:
    """One process at one moment (`ps -o stat,time,rss,nlwp -p PID`)."""

    pid: int
    state: str  # R S D Z T t I ...
    cpu_ticks: int  # utime + stime, in clock ticks
    rss_bytes: int
    threads: int


def read_proc_sample(pid: int) -> ProcSample | None:
    """The process's state, CPU time, RSS and thread count; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # comm may hold spaces and parentheses: the fields start after the last ')'
    try:
        rest = stat[stat.rindex(b")") + 2:].split()
        state = rest[0].decode()
        utime, stime = int(rest[11]), int(rest[12])
        threads = int(rest[17])
        rss_pages = int(rest[21])
    except (ValueError, IndexError):
        return None
    return ProcSample(pid=pid, state=state, cpu_ticks=utime + stime, rss_bytes=rss_pages * PAGE, threads=threads)


class CpuMeter:
    """CPU % of processes between two samples (100 = one core busy; a multi-threaded rank can exceed it)."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[int, float]] = {}

    def percent(self, sample: ProcSample, now: float | None = None) -> float | None:
        """CPU % since this pid was last seen; None the first time."""
        now = time.monotonic() if now is None else now
        prev = self._last.get(sample.pid)
        self._last[sample.pid] = (sample.cpu_ticks, now)
        if prev is None or now <= prev[1]:
            return None
        return max(0.0, (sample.cpu_ticks - prev[0]) / CLK_TCK / (now - prev[1]) * 100.0)

    def forget_except(self, pids: set[int]) -> None:
        for pid in [p for p in self._last if p not in pids]:
            del self._last[pid]


@dataclass
class NodeCounters:
    busy: int
    total: int


def read_node_counters() -> NodeCounters | None:
    """Busy and total jiffies of all CPUs (the first line of /proc/stat)."""
    try:
        with open("/proc/stat", "rb") as f:
            line = f.readline()
    except OSError:
        return None
    fields = [int(x) for x in line.split()[1:]]
    if len(fields) < 4:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return NodeCounters(busy=total - idle, total=total)


def node_cpu_percent(prev: NodeCounters | None, cur: NodeCounters | None) -> float | None:
    """Share of all CPUs that were busy between two readings (0-100)."""
    if prev is None or cur is None or cur.total <= prev.total:
        return None
    return round(100.0 * (cur.busy - prev.busy) / (cur.total - prev.total), 1)


def read_meminfo() -> tuple[int | None, int | None]:
    """(total, used) bytes, used = MemTotal - MemAvailable (what `free` calls used + buff/cache pressure)."""
    total = available = None
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemTotal:"):
                    total = int(line.split()[1]) * 1024
                elif line.startswith(b"MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                if total is not None and available is not None:
                    break
    except (OSError, ValueError, IndexError):
        return None, None
    if total is None:
        return None, None
    return total, (total - available) if available is not None else None


def read_loadavg() -> float | None:
    try:
        with open("/proc/loadavg", "rb") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
