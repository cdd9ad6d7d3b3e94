"""The nodes' kernel logs since a job started: Xid errors, the OOM killer, segfaults, hung tasks.

Pure functions over text: :data:`NODE_SCRIPT` is what runs on each node (``journalctl -k`` since the
job's start, else ``dmesg``), :func:`parse_node_output` reads what it printed, :func:`parse_lines` the
kernel lines themselves (``journalctl -k -o short-iso``, ``dmesg --time-format iso``, ``dmesg -T`` or
plain ``dmesg``). A node whose kernel log cannot be read (``dmesg: read kernel buffer failed: Operation
not permitted``) is said, per node, with the reason: it is not an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ml_debug.health.xid import parse_xids

KINDS = ("xid", "oom-kill", "segfault", "hung-task")

# Runs on each node with the job's start time (Unix seconds) as $1; names the node as Slurm does inside a
# step (several slurmd may share a host), else by its host name. journalctl first: it keeps what
# the ring buffer has dropped and takes --since; a node without a journal (or where journalctl says
# nothing) falls back to the ring buffer. No input from the job reaches this text: the time is an argument.
NODE_SCRIPT = r"""
echo "@@node ${SLURMD_NODENAME:-$(hostname)}"
if command -v journalctl >/dev/null 2>&1 && out=$(journalctl -k -q --no-pager -o short-iso --since "@$1" 2>&1) \
   && [ -n "$out" ] && ! printf '%s\n' "$out" | grep -qi -e '^No journal files' -e '^-- No entries --'; then
  echo "@@source journalctl"; printf '%s\n' "$out" | tail -n 200000
elif out=$(dmesg --time-format iso 2>&1) || out=$(dmesg 2>&1); then
  echo "@@source dmesg"; printf '%s\n' "$out" | tail -n 200000
else
  echo "@@unreadable $(printf '%s' "$out" | tail -n 1)"
fi
"""

# "Out of memory: Killed process 4242 (python) total-vm:...", "Memory cgroup out of memory: Killed process 4242 (python)"
_OOM = re.compile(r"(Memory cgroup out of memory|Out of memory)(?: \(oom_kill_allocating_task\))?: Kill(?:ed)? process "
                  r"(\d{1,18}) \(([^)]*)\)(.*)")
_OOM_RSS = re.compile(r"anon-rss:(\d{1,18})kB")
# "python[4242]: segfault at 0 ip 00007f... sp ... error 4 in libfoo.so[7f..+1000]"
_SEGV = re.compile(r"(\S+?)\[(\d{1,18})\]: segfault at (\S+) ip (\S+) sp \S+ error (\d{1,18})(?: in (\S+?)\[)?")
# "traps: python[4242] general protection fault ip:... sp:... error:0 in libc.so.6[...]"
_TRAP = re.compile(r"traps: (\S+?)\[(\d{1,18})\] (general protection fault|trap [^ ]+(?: [^ ]+)*?) ip:")
# "INFO: task python:4242 blocked for more than 120 seconds."
_HUNG = re.compile(r"INFO: task (.+?):(\d{1,18}) blocked for more than (\d{1,18}) seconds")

# time stamps: journalctl short-iso "2026-11-28T03:04:22+0000 host kernel: ", dmesg iso
# "2026-11-28T03:04:22,123456+00:00 ", dmesg -T "[Sat Nov 28 03:04:22 2026] ", plain "[12345.678901] "
_ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[,.](\d{1,18}))?([+-]\d\d:?\d\d|Z)?\s+")
_JOURNAL_HOST = re.compile(r"^\S+ kernel: ")
_CTIME = re.compile(r"^\[([A-Z][a-z]{2} [A-Z][a-z]{2} +\d+ \d\d:\d\d:\d\d \d{4})\]\s*")
_MONO = re.compile(r"^\[\s*(\d+\.\d+)\]\s*")


@dataclass
class KernelEvent:
    """One kernel line that matters to a job."""

    kind: str
    """xid, oom-kill, segfault or hung-task."""
    message: str
    """One line, what the kernel said (the time stamp removed)."""
    node: str | None = None
    time: float | None = None
    """Unix time, when the line carries a wall-clock stamp."""
    pid: int | None = None
    comm: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """``Xid 79 (GPU has fallen off the bus) on 0000:3b:00``, ``OOM killer killed pid 4242 (python)``..."""
        d = self.detail
        if self.kind == "xid":
            return f"Xid {d['xid']} ({d['meaning']}) on {d['bus_id']}"
        if self.kind == "oom-kill":
            rss = f", {d['anon_rss_kb'] // 1024} MiB resident" if d.get("anon_rss_kb") else ""
            return f"{d.get('killer', 'OOM killer')} killed pid {self.pid} ({self.comm}{rss})"
        if self.kind == "segfault":
            where = f" in {d['object']}" if d.get("object") else ""
            return f"{self.comm}[{self.pid}]: {d.get('what', 'segfault')}{where}"
        return f"task {self.comm}:{self.pid} blocked for more than {d.get('seconds')} s"


@dataclass
class NodeKernelLog:
    """One node's kernel log: how it was read (or why it could not be) and the events in it."""

    node: str
    source: str | None = None
    """journalctl or dmesg; None when unreadable."""
    readable: bool = False
    reason: str | None = None
    """Why it could not be read (permissions, no such tool, the node did not answer)."""
    lines: int = 0
    events: list[KernelEvent] = field(default_factory=list)


def split_stamp(line: str) -> tuple[float | None, str]:
    """(Unix time or None, the line without its time stamp and journal host prefix)."""
    m = _ISO.match(line)
    if m:
        stamp, frac, zone = m.group(1), m.group(2) or "", m.group(3) or ""
        zone = "+00:00" if zone in ("", "Z") else (zone if ":" in zone else f"{zone[:3]}:{zone[3:]}")
        try:
            t = datetime.fromisoformat(stamp + zone).timestamp() + (float("0." + frac) if frac else 0.0)
        except ValueError:
            t = None
        rest = line[m.end():]
        j = _JOURNAL_HOST.match(rest)
        return t, rest[j.end():] if j else rest
    m = _CTIME.match(line)
    if m:
        try:
            return datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y").timestamp(), line[m.end():]
        except ValueError:
            return None, line[m.end():]
    m = _MONO.match(line)
    if m:
        return None, line[m.end():]  # seconds since boot: no wall-clock time
    return None, line


def parse_line(line: str, node: str | None = None) -> KernelEvent | None:
    """The event one kernel line holds, or None."""
    t, text = split_stamp(line.rstrip("\n"))
    xids = parse_xids([text])  # health's reader of the driver's Xid lines, and its table of meanings
    if xids:
        x = xids[0]
        detail = {"xid": x.xid, "bus_id": x.bus_id, "meaning": x.meaning, "severity": x.severity,
                  "action": x.action, "text": x.detail}
        pid = re.search(r"pid=(\d{1,18})", text)
        name = re.search(r"name=([^,]+)", text)
        return KernelEvent("xid", text.strip(), node, t, int(pid.group(1)) if pid else None,
                           name.group(1).strip() if name else None, detail)
    m = _OOM.search(text)
    if m:
        rss = _OOM_RSS.search(m.group(4))
        detail = {"killer": "cgroup OOM killer" if m.group(1).startswith("Memory cgroup") else "OOM killer",
                  "anon_rss_kb": int(rss.group(1)) if rss else None}
        return KernelEvent("oom-kill", text.strip(), node, t, int(m.group(2)), m.group(3), detail)
    m = _SEGV.search(text)
    if m:
        detail = {"what": f"segfault at {m.group(3)}", "ip": m.group(4), "error": int(m.group(5)),
                  "object": m.group(6)}
        return KernelEvent("segfault", text.strip(), node, t, int(m.group(2)), m.group(1), detail)
    m = _TRAP.search(text)
    if m:
        obj = re.search(r" in (\S+?)\[", text)
        detail = {"what": m.group(3), "object": obj.group(1) if obj else None}
        return KernelEvent("segfault", text.strip(), node, t, int(m.group(2)), m.group(1), detail)
    m = _HUNG.search(text)
    if m:
        return KernelEvent("hung-task", text.strip(), node, t, int(m.group(2)), m.group(1),
                           {"seconds": int(m.group(3))})
    return None


def parse_lines(lines: list[str], node: str | None = None, since: float | None = None,
                until: float | None = None) -> list[KernelEvent]:
    """Every event in these kernel lines; with `since` and `until`, those outside that time are left out (a
    line without a wall-clock time is kept: it cannot be placed)."""
    out = []
    for line in lines:
        ev = parse_line(line, node)
        if ev is not None and (ev.time is None or ((since is None or ev.time >= since)
                                                   and (until is None or ev.time <= until))):
            out.append(ev)
    return out


_REFUSALS = ("Operation not permitted", "Permission denied", "read kernel buffer failed", "not seeing messages",
             "No journal files", "command not found", "not found")


def parse_node_output(text: str, node: str, since: float | None = None, until: float | None = None) -> NodeKernelLog:
    """What :data:`NODE_SCRIPT` printed on one node."""
    log = NodeKernelLog(node=node)
    body: list[str] = []
    for line in text.splitlines():
        if line.startswith("@@node "):
            log.node = line[7:].strip() or node
        elif line.startswith("@@source "):
            log.source = line[9:].strip()
            log.readable = True
        elif line.startswith("@@unreadable"):
            log.reason = line[12:].strip() or "no kernel log could be read"
        else:
            body.append(line)
    if log.readable and len(body) <= 2 and any(r in " ".join(body) for r in _REFUSALS):
        log.readable, log.reason = False, body[-1].strip() if body else "empty"
        body = []
    if not log.readable and log.reason is None:
        log.reason = "the node printed no kernel log"
    log.lines = len(body)
    log.events = parse_lines(body, log.node, since, until) if log.readable else []
    return log
