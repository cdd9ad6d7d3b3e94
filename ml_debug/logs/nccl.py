"""What NCCL_DEBUG=INFO lines say: version, network, transports per peer, rings, trees, warnings.

NCCL writes ``HOST:PID:TID [CUDADEV] NCCL INFO <message>`` (``WARN`` for warnings, sometimes after the
source location: ``[0] misc/socket.cc:484 NCCL WARN ...``); rank 0 also prints a bare
``NCCL version 2.21.5+cuda12.4``. The lines used here:

- ``comm 0x... rank R nRanks N nNodes M localRanks L localRank l`` (older: ``rank R nranks N cudaDev D ...
  Init COMPLETE``): which process (host, pid) is which rank;
- ``Bootstrap : Using eth0:10.0.0.1<0>``, ``NET/IB : Using [0]mlx5_0:1/IB ...``,
  ``NET/IB : No device found.``, ``NET/Socket : Using [0]eth0:10.0.0.1<0>``, ``Using network IB``: the
  network of each host;
  ``NCCL_IB_DISABLE set by environment to 1.``: settings;
- ``Channel 00/0 : 8[0] -> 15[7] via P2P/IPC/read``, ``... [send] via NET/IB/3`` (older: ``Ring 00 : 3[b0] ->
  0[80] via direct shared memory``): the transport between two ranks; ``Channel 00/32 :    0   1   2   3`` /
  ``Ring 00 : 0 1 2 3``: ring orders; ``Trees [0] 1/-1/-1->0->-1 [1] ...``: trees.

The slow-path causes flagged: TCP sockets instead of InfiniBand/RoCE between nodes, P2P, SHM or IB disabled by
an environment variable, hosts that disagree on the network interface or on their IB devices, mixed NCCL
versions, ranks of one node talking through the network.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ml_debug.core.ranges import compress
from ml_debug.logs.text import few, numbers_aside

_LINE = re.compile(r"(?P<host>[\w.\-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?:(?P<loc>[\w./\-]+:\d+) )?"
                   r"NCCL (?P<level>INFO|WARN|TRACE|ABORT) ?(?P<msg>.*)")
_BARE_VERSION = re.compile(r"NCCL version (\S+)")
_IFACE = re.compile(r"\[\d+\](\S+?):[\d.a-fA-F:%]+<\d+>")
_IB_DEV = re.compile(r"\[\d+\]\s*(\w+):\d+/(\w+)")
_TREE_ITEM = re.compile(r"\[(\d+)\] (\S+)")

MAX_PAIRS = 200_000  # bounded memory: a 4096-rank job has ~130k ring/tree neighbour pairs at most
MAX_WARNINGS = 200
DISABLE_VARS = {
    "NCCL_IB_DISABLE": "InfiniBand/RoCE is off: inter-node traffic goes over TCP sockets",
    "NCCL_P2P_DISABLE": "GPU peer-to-peer (NVLink/PCIe) is off: GPUs of a node exchange data through host memory",
    "NCCL_SHM_DISABLE": "shared-memory transport is off: GPUs without P2P go through the network stack",
    "NCCL_NET_GDR_LEVEL": "GPUDirect RDMA level set by hand",
    "NCCL_NVLS_ENABLE": "NVLink SHARP set by hand",
}
SLOW_INTERFACES = ("lo", "docker", "virbr", "veth", "br-")


def transport_family(via: str) -> str:
    """``P2P/IPC/read`` -> ``P2P``; ``NET/IB/3`` -> ``NET/IB``; ``direct shared memory`` -> ``SHM``."""
    via = via.strip()
    if via.startswith("NET/"):
        return "NET/" + via.split("/")[1]
    if via.startswith(("P2P", "direct pointer")):
        return "P2P"
    if via.startswith("SHM") or "shared memory" in via:
        return "SHM"
    collective = next((name for name in ("CollNet", "NVLS", "COLLNET") if via.startswith(name)), None)
    return collective or via.split("/")[0].split()[0]


@dataclass
class _Warn:
    text: str
    count: int = 0
    ranks: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)


class NcclCollector:
    """Reads NCCL debug lines as they stream by; :meth:`report` sums them up (bounded memory)."""

    def __init__(self) -> None:
        self.lines = 0
        self.versions: Counter[str] = Counter()
        self.proc_rank: dict[tuple[str, int], int] = {}
        self.rank_host: dict[int, str] = {}
        self._host_said: set[int] = set()  # ranks whose host a comm line said (a channel line only suggests one)
        self.nranks: Counter[int] = Counter()
        self.nnodes: Counter[int] = Counter()
        self.bootstrap: dict[str, set[str]] = defaultdict(set)
        self.socket_ifaces: dict[str, set[str]] = defaultdict(set)
        self.ib_devices: dict[str, set[str]] = defaultdict(set)
        self.no_ib: set[str] = set()
        self.network: dict[str, set[str]] = defaultdict(set)
        self.env: dict[str, Counter[str]] = defaultdict(Counter)
        self.pairs: dict[tuple[int, int], set[str]] = {}
        self.pair_examples: dict[str, str] = {}
        self.pairs_dropped = 0
        self.rings: dict[int, str] = {}
        self.trees: dict[int, int] = {}
        self.connected: dict[str, set[int]] = defaultdict(set)
        self.warnings: dict[str, _Warn] = {}
        self.warnings_dropped = 0

    # ------------------------------------------------------------------ reading

    def feed(self, text: str, rank: int | None) -> tuple[str, str, str] | None:
        """Read one line; (level, host, message) when it is an NCCL debug line, else None."""
        m = _LINE.search(text)
        if m is None:
            v = _BARE_VERSION.match(text)
            if v:
                self.versions[v.group(1)] += 1
                self.lines += 1
                return ("INFO", "", text)
            return None
        self.lines += 1
        host, pid_text, msg, level = m.group("host", "pid", "msg", "level")
        pid = int(pid_text)
        r = self.proc_rank.get((host, pid), rank)
        if level == "WARN":
            self._warn(msg, host, r)
        else:
            self._info(msg, host, pid, r)
        return (level, host, msg)

    def _warn(self, msg: str, host: str, rank: int | None) -> None:
        ranks = set() if rank is None else {rank}
        self._warning(numbers_aside(msg)[:200], _Warn(msg[:300], count=1, ranks=ranks, hosts={host}))

    def _warning(self, key: str, w: _Warn) -> None:
        """``w`` counted under ``key`` (one text, whatever its numbers), or as dropped past MAX_WARNINGS."""
        seen = self.warnings.get(key)
        if seen is None and len(self.warnings) >= MAX_WARNINGS:
            self.warnings_dropped += w.count
        elif seen is None:
            self.warnings[key] = w
        else:
            seen.count += w.count
            seen.hosts |= w.hosts
            seen.ranks |= w.ranks

    def _info(self, msg: str, host: str, pid: int, rank: int | None) -> None:
        """What an INFO message says, recorded by the first row of ``_INFO`` that reads it."""
        if msg.startswith(_FIRST_WORDS):
            for word, rx, record in _STARTING:
                if msg.startswith(word):
                    m = rx.match(msg)
                    if m:
                        record(self, m, host, pid, rank)
                    return
        for word, rx, record in _HOLDING:
            if word in msg:
                m = rx.search(msg)
                if m:
                    record(self, m, host, pid, rank)
                    return

    def _channel(self, m: re.Match[str], host: str, pid: int, rank: int | None) -> None:
        channel, src, dst, via, order = m.groups()
        if via:
            self._pair(int(src), int(dst), via, host)
        elif len(self.rings) < 64:
            self.rings.setdefault(int(channel), " ".join(order.split()))

    def _trees(self, m: re.Match[str], host: str, pid: int, rank: int | None) -> None:
        if rank is not None:
            self.trees[rank] = len(_TREE_ITEM.findall(m.string))

    def _connected(self, m: re.Match[str], host: str, pid: int, rank: int | None) -> None:
        if rank is not None:
            self.connected[m.group(1)].add(rank)

    def _comm(self, m: re.Match[str], host: str, pid: int, rank: int | None) -> None:
        r = int(m.group(1))
        self.proc_rank[(host, pid)] = r
        self.rank_host[r] = host
        self._host_said.add(r)
        self.nranks[int(m.group(2))] += 1
        if m.group(3):
            self.nnodes[int(m.group(3))] += 1

    def _pair(self, src: int, dst: int, via: str, host: str) -> None:
        fam = transport_family(via)
        self.pair_examples.setdefault(fam, f"{src} -> {dst} via {via.strip()}")
        key = (src, dst)
        got = self.pairs.get(key)
        if got is None:
            if len(self.pairs) >= MAX_PAIRS:
                self.pairs_dropped += 1
                return
            got = self.pairs[key] = set()
        got.add(fam)
        self.rank_host.setdefault(src, host)

    def absorb(self, later: NcclCollector) -> None:
        """Take in what ``later`` read from the sources after this collector's (see ``Collector.absorb``).
        Below the caps the result is what one collector reading everything in order would hold; past
        MAX_PAIRS or MAX_WARNINGS the counts of what was not kept may differ slightly."""
        self.lines += later.lines
        self.versions += later.versions
        self.nranks += later.nranks
        self.nnodes += later.nnodes
        self.proc_rank.update(later.proc_rank)
        for rank, host in later.rank_host.items():
            if rank in later._host_said:
                self.rank_host[rank] = host
                self._host_said.add(rank)
            else:
                self.rank_host.setdefault(rank, host)
        tallies: tuple[tuple[dict[str, Any], dict[str, Any]], ...] = (
            (self.bootstrap, later.bootstrap), (self.socket_ifaces, later.socket_ifaces), (self.env, later.env),
            (self.ib_devices, later.ib_devices), (self.network, later.network), (self.connected, later.connected))
        for mine, theirs in tallies:
            for key, got in theirs.items():
                mine[key].update(got)  # a set's union, a Counter's sum
        self.no_ib |= later.no_ib
        for pair, families in later.pairs.items():
            got = self.pairs.get(pair)
            if got is not None:
                got |= families
            elif len(self.pairs) < MAX_PAIRS:
                self.pairs[pair] = set(families)
            else:
                self.pairs_dropped += 1
        self.pairs_dropped += later.pairs_dropped
        self.pair_examples = later.pair_examples | self.pair_examples  # the first example of a family stays
        for ring, order in later.rings.items():
            if len(self.rings) < 64:
                self.rings.setdefault(ring, order)
        self.trees.update(later.trees)
        for key, w in later.warnings.items():
            self._warning(key, w)
        self.warnings_dropped += later.warnings_dropped

    # ------------------------------------------------------------------ summing up

    def report(self) -> dict[str, Any] | None:
        """The NCCL section of the report, or None when no NCCL debug line was seen."""
        if not self.lines:
            return None
        transports = Counter(family for families in self.pairs.values() for family in families)
        hosts = sorted({*self.bootstrap, *self.socket_ifaces, *self.ib_devices, *self.no_ib, *self.network})
        per_host = [{"host": h, "network": sorted(self.network.get(h, ())),
                     "bootstrap_interface": sorted(self.bootstrap.get(h, ())),
                     "socket_interfaces": sorted(self.socket_ifaces.get(h, ())),
                     "ib_devices": sorted(self.ib_devices.get(h, ())),
                     "no_ib_device": h in self.no_ib} for h in hosts]
        return {
            "lines": self.lines,
            "versions": dict(self.versions),
            "world_size": self.nranks.most_common(1)[0][0] if self.nranks else None,
            "nodes": self.nnodes.most_common(1)[0][0] if self.nnodes else (len(hosts) or None),
            "ranks_seen": compress(self.rank_host) if self.rank_host else "",
            "hosts": per_host,
            "environment": {k: dict(v) for k, v in sorted(self.env.items())},
            # most pairs first, ties by name: the same order whichever process read which file (a set's order is not)
            "transports": [{"transport": t, "pairs": n, "example": self.pair_examples.get(t, "")}
                           for t, n in sorted(transports.items(), key=lambda tn: (-tn[1], tn[0]))],
            "pairs_dropped": self.pairs_dropped,
            "rings": [{"channel": c, "order": o} for c, o in sorted(self.rings.items())[:8]],
            "ring_count": len(self.rings),
            "trees": {"ranks": len(self.trees), "per_rank": dict(Counter(self.trees.values()))},
            "connected": {k: compress(v) for k, v in self.connected.items()},
            "warnings": [{"text": w.text, "count": w.count, "ranks": compress(w.ranks), "hosts": sorted(w.hosts)}
                         for w in sorted(self.warnings.values(), key=lambda w: -w.count)],
            "warnings_dropped": self.warnings_dropped,
            "findings": self._findings(transports),
        }

    def _findings(self, transports: Counter[str]) -> list[dict[str, str]]:
        """The slow-path causes these lines show, most important first: [{code, severity, text}]."""
        out: list[dict[str, str]] = []

        def add(code: str, severity: str, text: str) -> None:
            out.append({"code": code, "severity": severity, "text": text})

        if socket_pairs := transports.get("NET/Socket", 0):
            ib_off = sorted(v for v in self.env.get("NCCL_IB_DISABLE", {}) if v.strip() not in ("0", ""))
            net = sorted(self.env.get("NCCL_NET", {}))
            why = [reason for reason, said in (
                (f"NCCL_IB_DISABLE={','.join(ib_off)}", ib_off),
                (f"no InfiniBand device found on {few(sorted(self.no_ib), 8)}", self.no_ib),
                (f"NCCL_NET={','.join(net)}", net)) if said]
            add("socket-not-ib", "warning",
                f"inter-node traffic goes over TCP sockets (NET/Socket, {socket_pairs} peer connection(s)), not "
                "InfiniBand/RoCE: expect a fraction of the bandwidth"
                + (f" ({'; '.join(why)})" if why else ""))
        for var, what in DISABLE_VARS.items():
            values = self.env.get(var)
            switch = var.endswith("_DISABLE")  # a switch is news when on; a level set by hand always is
            if values and (not switch or any(v.strip() not in ("0", "") for v in values)):
                add(var.lower().replace("_", "-"), "warning" if switch else "info",
                    f"{var}={','.join(sorted(values))}: {what}")
        chosen = {h: ifs for h, ifs in self.socket_ifaces.items() if ifs} or \
                 {h: ifs for h, ifs in self.bootstrap.items() if ifs}
        names = {h: frozenset(i.rstrip("0123456789") for i in ifs) for h, ifs in chosen.items()}
        if len(set(names.values())) > 1:
            groups: dict[frozenset[str], list[str]] = defaultdict(list)
            for h, n in names.items():
                groups[n].append(h)
            text = "; ".join(f"{few(sorted(hs), 4)}: {', '.join(sorted(chosen[hs[0]]))}" for hs in groups.values())
            add("interface-mismatch", "warning",
                f"hosts use different network interfaces: {text} (set NCCL_SOCKET_IFNAME to one interface name "
                "every node has)")
        if bad := sorted(h for h, ifs in chosen.items() if any(i.startswith(SLOW_INTERFACES) for i in ifs)):
            add("bad-interface", "warning",
                f"{few(bad, 4)}: NCCL uses a loopback, docker or virtual "
                f"interface ({', '.join(sorted({i for h in bad for i in chosen[h]}))}): set NCCL_SOCKET_IFNAME")
        ib = {h: frozenset(d) for h, d in self.ib_devices.items() if d}
        if ib and (len(set(ib.values())) > 1 or (self.no_ib - set(ib))):
            counts = ", ".join(str(c) for c in sorted({len(d) for d in ib.values()}))
            add("ib-mismatch", "warning", f"hosts see different InfiniBand devices ({counts} device(s)"
                + (f"; none on {', '.join(sorted(self.no_ib)[:4])}" if self.no_ib - set(ib) else "")
                + "): a missing or down HCA")
        if len(self.versions) > 1:
            add("version-mismatch", "warning",
                "ranks run different NCCL versions: " + ", ".join(f"{v} ({n})" for v, n in self.versions.items()))
        if same_node_net := [(a, b) for (a, b), fams in self.pairs.items()
                             if any(f.startswith("NET") for f in fams) and self.rank_host.get(a) is not None
                             and self.rank_host.get(a) == self.rank_host.get(b)]:
            a, b = same_node_net[0]
            add("intra-node-net", "warning",
                f"{len(same_node_net)} pair(s) of ranks on the same node talk through the network (e.g. {a} -> {b} "
                f"on {self.rank_host[a]}): no P2P/SHM path between those GPUs")
        if transports.get("SHM") and not transports.get("P2P"):
            add("shm-not-p2p", "info",
                "GPUs of a node exchange data through host shared memory (SHM), never P2P: check NCCL_P2P_DISABLE, "
                "NCCL_P2P_LEVEL and the PCIe/NVLink topology (nvidia-smi topo -m)")
        return out


_Record = Callable[[NcclCollector, "re.Match[str]", str, int, "int | None"], None]
# a pair of ranks and its transport ("Channel 00/0 : 8[0] -> 15[7] via P2P/IPC/read"), or a ring's order
_CHANNEL = (r"(?:Channel|Ring) (\d+)(?:/\d+)? :(?: (\d+)(?:\[\w+\])? -> (\d+)(?:\[\w+\])?(?: \[(?:send|receive)\])? via (.+)$"
            r"|((?:\s+\d+)+)\s*$)")
_INFO: tuple[tuple[str, str, _Record], ...] = (
    # What NCCL's INFO messages say, as data: (the word a message starts with (^) or holds, the pattern then read,
    # what a match records). The first row whose word is there and whose pattern matches records the message; a
    # message that starts with a ^ word is that row's or none's (a "Channel" message that is neither a pair of ranks
    # nor a ring order is no comm line). Most messages cost a few substring tests and one pattern at most.
    ("^Channel", _CHANNEL, NcclCollector._channel),
    ("^Tree", r"Trees? (?:\[\d+\] \S+\s*)+", NcclCollector._trees),
    ("^Ring", _CHANNEL, NcclCollector._channel),  # NCCL before 2.4
    ("^NCCL version", r"NCCL version\S*(?:\s+(\S+))?", lambda c, m, *_: c.versions.update([m[1] or m.string])),
    ("comm 0x", r"comm 0x[0-9a-f]+ rank (\d+) n[Rr]anks (\d+)(?: nNodes (\d+) localRanks (\d+) localRank (\d+))?",
     NcclCollector._comm),
    ("Bootstrap", r"Bootstrap ?: Using (?:\[\d+\])?(\S+?):", lambda c, m, host, *_: c.bootstrap[host].add(m[1])),
    ("NET/IB", r"NET/IB ?: No device found", lambda c, m, host, *_: c.no_ib.add(host)),
    ("NET/IB", r"NET/IB ?: Using (.*)",
     lambda c, m, host, *_: c.ib_devices[host].update(f"{d}/{kind}" for d, kind in _IB_DEV.findall(m[1]))),
    ("NET/Socket", r"NET/Socket ?: Using (.*)", lambda c, m, host, *_: c.socket_ifaces[host].update(_IFACE.findall(m[1]))),
    ("Using network ", r"Using network (\S+(?: \S+)?)", lambda c, m, host, *_: c.network[host].add(m[1])),
    (" set by environment to ", r"(NCCL_\w+) set by environment to (.*?)\.?$",
     lambda c, m, *_: c.env[m[1]].update([m[2].strip()])),
    ("Connected all ", r"Connected all (rings|trees)", NcclCollector._connected),
)
_STARTING = tuple((word[1:], re.compile(pattern), record) for word, pattern, record in _INFO if word[0] == "^")
_HOLDING = tuple((word, re.compile(pattern), record) for word, pattern, record in _INFO if word[0] != "^")
_FIRST_WORDS = tuple(word for word, _, _ in _STARTING)
