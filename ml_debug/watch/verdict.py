"""The per-rank progress model: from plain samples to "stalled", "straggler" and "not answering".

Inputs, all plain data (so remote nodes, tests and benchmarks feed it alike):

- a node sample (:meth:`Tracker.add_node`), in the format ``mldebug top``'s agent streams: the
  node's rank processes (pid, rank, state, CPU %), its GPUs (utilisation, power as % of the limit,
  the pids on each) and its progress files (step, rate, age of the last change);
- stack observations (:meth:`Tracker.add_stacks`), one per rank and stack round: a key that is
  the same when the main-thread stack is the same, where the rank is, and whether it waits in a
  collective.

What counts as progress for a rank:

- with a progress file (its own, or one without a rank that stands for the whole job): the file
  grew; nothing else counts, so a rank spinning at 100% CPU without writing a step stalls;
- without one: CPU activity (at least :data:`CPU_ACTIVE_PCT` of a core) unless its GPU is busy at
  low power (a NCCL kernel spinning while it waits for a peer), GPU work (busy at real power), or a
  stack that differs from the previous stack sample.

A rank is **stalled** after ``stall`` seconds without progress (never in the first ``grace``
seconds of watching), or after :data:`EXITED_STALL_S` once a peer has exited. A rank is a
**straggler** when its step rate stays below the median rate divided by ``straggler_factor``, or,
for ranks that step in lockstep (the rates are then equal), when over at least
:data:`MIN_STACK_SAMPLES` stack rounds its peers waited in collectives and it did not: the others
wait for it. A node that sends nothing is **not answering**; its ranks are
not judged, and when a node that answered before stays silent for ``stall`` seconds, the silence
itself is an incident.
"""

from __future__ import annotations

import itertools
import math
import operator
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from ml_debug.core.gcpause import gc_paused
from ml_debug.core.ranges import compress
from ml_debug.sampling.sample import GpuSample, NodeSample, ProgressFile, RankSample

CPU_ACTIVE_PCT = 5.0
"""A rank using at least this % of one core is doing something (a rank blocked in a gloo/NCCL wait
uses almost none)."""
GPU_BUSY_PCT = 80.0
GPU_LOW_POWER_PCT = 30.0
"""Utilisation at least GPU_BUSY_PCT at no more than GPU_LOW_POWER_PCT of the power limit: a kernel
that spins (NCCL waiting for a peer), not one that computes."""
GPU_WORKING = (50.0, 40.0)
"""(utilisation %, power %) at or above which a GPU is computing: progress."""
EXITED_STALL_S = 30.0
"""Once a rank has exited, the others are stalled after this long without progress (or --stall, if
shorter): a peer's exit usually means the rest will hang until their collective times out."""
SLOW_SAMPLES = 3
"""Consecutive samples below the median rate before a rank is a straggler."""
MIN_STACK_SAMPLES = 8
STACK_WINDOW = 16
STRAGGLER_OTHERS_WAIT = 0.6
STRAGGLER_OWN_WAIT = 0.2
STRAGGLER_Z = 3.0
"""Lockstep stragglers: over at least MIN_STACK_SAMPLES of the last STACK_WINDOW stack rounds, the
other ranks waited in collectives in at least STRAGGLER_OTHERS_WAIT of their samples, this rank in
at most STRAGGLER_OWN_WAIT, and the difference is significant (two-proportion z >= STRAGGLER_Z)."""


def clock(t: float) -> str:
    """Wall-clock time as ``HH:MM:SS`` (local time)."""
    return time.strftime("%H:%M:%S", time.localtime(t))


def seconds(s: float) -> str:
    """`42 s`, `5.2 min`, `3.1 h`."""
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


@dataclass
class StackObs:
    """One stack sample of one rank."""

    time: float
    key: str
    where: str | None
    in_collective: bool
    collective: str | None = None


@dataclass
class RankTrack:
    """What is known about one rank process."""

    key: str  # "<node label>:<pid>"
    node: str  # the label the node was reached by
    host: str  # its hostname
    pid: int
    rank: int | None
    local_rank: int | None = None
    world_size: int | None = None
    first_seen: float = 0.0
    last_seen: float = 0.0
    last_progress: float = 0.0
    progress_why: str = "first seen"
    status: str = "ok"  # ok | stalled | straggler | exited | unknown
    state: str | None = None  # R S D Z T ...
    cpu_pct: float | None = None
    gpu: list[dict[str, Any]] = field(default_factory=list)
    file: ProgressFile | None = None
    signs: list[str] = field(default_factory=list)
    stacks: deque[StackObs] = field(default_factory=lambda: deque(maxlen=STACK_WINDOW))
    slow: int = 0
    straggler_why: str | None = None
    by_file: bool = False  # its progress is judged by a progress file

    @property
    def label(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"
        return f"{who} ({self.host}, pid {self.pid})" if self.rank is not None else f"{who} ({self.host})"

    def where(self) -> str | None:
        return self.stacks[-1].where if self.stacks else None

    def as_dict(self, now: float) -> dict[str, Any]:
        stacks = self.stacks
        idle = now - self.last_progress
        return {"rank": self.rank, "host": self.host, "node": self.node, "pid": self.pid,
                "local_rank": self.local_rank, "world_size": self.world_size, "status": self.status,
                "state": self.state, "cpu_pct": self.cpu_pct, "gpu": self.gpu,
                "progress_file": None if self.file is None else self.file.to_json(),
                "last_progress": round(self.last_progress, 3), "idle_s": round(idle if idle > 0.0 else 0.0, 1),
                "progress_why": self.progress_why, "where": stacks[-1].where if stacks else None,
                "signs": list(self.signs), "straggler_why": self.straggler_why,
                "stack_samples": len(stacks),
                "waits_in_collectives": sum(s.in_collective for s in stacks) if stacks else 0}


@dataclass
class NodeTrack:
    """One node as the watcher reaches it."""

    label: str
    host: str | None = None
    last_sample: float | None = None  # wall time a sample last arrived
    error: str | None = None
    answering: bool = True
    silent_since: float | None = None
    progress: list[ProgressFile] = field(default_factory=list)  # files without a rank (the job's)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "host": self.host, "answering": self.answering, "error": self.error,
                "last_sample": self.last_sample, "silent_since": self.silent_since, "notes": self.notes}


@dataclass
class Incident:
    """What the watcher decided: an incident of one kind, with the ranks or nodes concerned."""

    kind: str  # stall | straggler | unreachable | requested
    time: float
    detail: str
    ranks: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    since: float | None = None
    exited: list[dict[str, Any]] = field(default_factory=list)  # ranks that had exited by then

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "time": round(self.time, 3), "detail": self.detail, "ranks": self.ranks,
                "nodes": self.nodes, "since": None if self.since is None else round(self.since, 3),
                "exited": self.exited}


def _who(ranks: list[RankTrack]) -> str:
    known = sorted(r.rank for r in ranks if r.rank is not None)
    if len(known) == len(ranks) and known:
        return ("rank " if len(known) == 1 else "ranks ") + compress(known)
    return ", ".join(r.label for r in ranks)


class Tracker:
    """The watcher's memory: every rank and node, and the decisions made from them."""

    def __init__(self, *, stall: float, grace: float, straggler_factor: float, interval: float,
                 node_timeout: float, started: float | None = None) -> None:
        self.stall = stall
        self.grace = grace
        self.factor = straggler_factor
        self.interval = interval
        self.node_timeout = node_timeout
        self.started = time.time() if started is None else started
        self.ranks: dict[str, RankTrack] = {}
        self.nodes: dict[str, NodeTrack] = {}
        self.events: list[str] = []  # state changes, for the person watching
        self.reported: set[tuple[str, str]] = set()  # (kind, rank key or node label) already in an incident
        self.samples = 0
        self.stack_rounds = 0
        # per node, its ranks' keys in the order they were first seen (self.ranks's order): a node's sample
        # looks at its own ranks only, not at every rank of the job (16k ranks, 2k nodes: 33M steps a round)
        self._on_node: dict[str, dict[str, None]] = {}
        self._with_files: set[str] = set()  # the nodes whose job-wide progress files are known
        # (rank, its file) updated since the step rates were last judged: judged together against one median
        self._to_rate: list[tuple[RankTrack, ProgressFile]] = []
        self._seen_ranks: list[RankTrack] = []  # self.ranks's values when they were last sorted, and sorted
        self._sorted_ranks: list[RankTrack] = []

    # -- input ----------------------------------------------------------------------------------
    def node(self, label: str) -> NodeTrack:
        if label not in self.nodes:
            self.nodes[label] = NodeTrack(label)
        return self.nodes[label]

    def add_node(self, label: str, sample: NodeSample | None, received: float | None,
                 error: str | None = None) -> None:
        """One node's latest sample (None when it has none, with the reason in `error`)."""
        n = self.node(label)
        n.error = error
        if sample is None or received is None:
            return
        if n.last_sample is not None and received <= n.last_sample:
            return  # the same sample again
        self.samples += 1
        n.host = sample.node.host or n.host or label
        n.last_sample = received
        n.notes = list(sample.notes)
        was = n.answering
        n.answering, n.silent_since = True, None
        if not was:
            self.events.append(f"node {label} answers again")
        gpus = {g.index: g for g in sample.gpus}
        n.progress = [f for f in sample.progress if f.rank is None]
        if n.progress:
            self._with_files.add(label)
        else:
            self._with_files.discard(label)
        mine = self._on_node.setdefault(label, {})
        seen: set[str] = set()
        for row in sample.ranks:
            key = f"{label}:{row.pid}"
            seen.add(key)
            r = self.ranks.get(key)
            if r is None:
                r = self.ranks[key] = RankTrack(key=key, node=label, host=n.host, pid=row.pid,
                                                rank=row.rank, local_rank=row.local_rank,
                                                world_size=row.world_size, first_seen=received,
                                                last_progress=received)
                mine.pop(key, None)  # (a key removed from self.ranks and seen again is last there too)
                mine[key] = None
                self.events.append(f"watching {r.label}")
            self._update_rank(r, row, gpus, n, received)
        if mine.keys() <= seen and mine.keys() <= self.ranks.keys():
            return  # every rank of the node is still there (the common case, tested at C speed)
        for key in list(mine):
            r = self.ranks.get(key)
            if r is None:  # removed by its owner (the exporter forgets exited ranks)
                del mine[key]
                continue
            if key not in seen and r.status != "exited":
                r.status, r.state = "exited", None
                r.signs.append(f"exited by {clock(received)}")
                self.events.append(f"{r.label} exited")

    def _update_rank(self, r: RankTrack, row: RankSample, gpus: dict[int, GpuSample], n: NodeTrack,
                     received: float) -> None:
        # once per rank and sample (16k ranks a round): the common case (a rank on its GPU, with its own
        # readable progress file) takes no detour
        r.last_seen = received
        if r.status in ("exited", "unknown"):
            r.status = "ok"
        r.state = state = row.state
        r.cpu_pct = row.cpu_pct
        mine = [gpus[i] for i in row.gpu if i in gpus] if row.gpu else []
        r.gpu = [{"index": g.index, "util_pct": g.util_pct, "power_pct": g.power_pct,
                  "mem_used_bytes": g.mem_used_bytes, "mem_total_bytes": g.mem_total_bytes}
                 for g in mine]
        signs = [s for s in r.signs if s.startswith("exited")] if r.signs else []
        if state == "D":
            signs.append("in D state (uninterruptible: I/O or a driver call)")
        elif state == "Z":
            signs.append("a zombie (exited, not reaped)")
        spinning = [g for g in mine if (g.util_pct or 0) >= GPU_BUSY_PCT
                    and g.power_pct is not None and g.power_pct <= GPU_LOW_POWER_PCT]
        if spinning:
            g = spinning[0]
            signs.append(f"GPU {g.index} {g.util_pct or 0:.0f}% busy at {g.power_pct or 0:.0f}% of its power limit "
                         "(a kernel spinning while it waits for a peer)")
        r.signs = signs
        own = row.progress
        r.file = own  # shown, an unreadable one with its error
        # one that cannot be read says nothing: judge by CPU/GPU
        if own is not None:
            files = [] if own.error else [own]
        else:
            files = [f for f in n.progress if not f.error]
            if self._with_files:
                files += [f for other in self.nodes.values() if other is not n for f in other.progress if not f.error]
        if files:
            first = not r.by_file  # the file knows better than "first seen": it may have stopped long ago
            r.by_file = True
            for f in files:
                age = f.age_s
                if age is None:
                    continue
                changed = received - float(age)
                if first or changed > r.last_progress + 1e-6:
                    first = False
                    r.last_progress = changed
                    r.progress_why = f"{f.path} grew (step {f.step})" if f.step is not None else f"{f.path} grew"
            if own is not None and not own.error:
                self._to_rate.append((r, own))
            return
        cpu = r.cpu_pct or 0.0
        working = [g for g in mine if (g.util_pct or 0) >= GPU_WORKING[0] and (g.power_pct or 0) >= GPU_WORKING[1]]
        if working:
            g = working[0]
            r.last_progress, r.progress_why = received, f"GPU {g.index} computing ({g.util_pct or 0:.0f}% busy, " \
                                                         f"{g.power_pct or 0:.0f}% power)"
        elif cpu >= CPU_ACTIVE_PCT and not spinning and state not in ("D", "Z", "T", "t"):
            r.last_progress, r.progress_why = received, f"CPU {cpu:.0f}%"

    def _judge_rates(self) -> None:
        """Each rank's step rate since the last judgement against the median of every rank's (computed
        once: per rank, it made a round of a 16k-rank job cost 16k sorts of 16k rates)."""
        todo, self._to_rate = self._to_rate, []
        if not todo:
            return
        rates = sorted([rate for rk in self.ranks.values()
                        if (f := rk.file) is not None and (rate := f.rate) is not None and rk.status != "exited"])
        median = None if len(rates) < 2 else rates[len(rates) // 2] if len(rates) % 2 else \
            (rates[len(rates) // 2 - 1] + rates[len(rates) // 2]) / 2
        factor = self.factor
        slow_below = median / factor if factor > 0 and median is not None and median > 0 else None
        for r, f in todo:
            rate = f.rate
            if slow_below is not None and rate is not None and rate < slow_below:
                r.slow += 1
                r.straggler_why = (f"{rate:.3g} steps/s while the median rank makes {median:.3g} "
                                   f"(below 1/{factor:g} of it for {r.slow} samples)")
            else:
                r.slow = 0

    def add_stacks(self, observations: list[dict[str, Any]], taken: float) -> None:
        """One stack round: ``{"host", "pid", "key", "where", "in_collective", "collective"}`` per rank."""
        self.stack_rounds += 1
        by_host_pid = {(r.host, r.pid): r for r in self.ranks.values()}
        for o in observations:
            r = by_host_pid.get((str(o.get("host")), int(o.get("pid", -1))))
            if r is None or r.status == "exited":
                continue
            obs = StackObs(time=taken, key=str(o["key"]), where=o.get("where"),
                           in_collective=bool(o.get("in_collective")), collective=o.get("collective"))
            prev = r.stacks[-1] if r.stacks else None
            r.stacks.append(obs)
            if prev is not None and prev.key != obs.key and r.file is None and not self._job_files():
                if taken > r.last_progress:
                    r.last_progress, r.progress_why = taken, f"its stack changed (now in {obs.where})"

    def _job_files(self) -> bool:
        return any(n.progress for n in self.nodes.values())

    # -- decisions ------------------------------------------------------------------------------
    def check_nodes(self, now: float) -> None:
        """Mark nodes that sent nothing for interval + node_timeout as not answering."""
        limit = self.interval + self.node_timeout
        for n in self.nodes.values():
            last = n.last_sample if n.last_sample is not None else self.started
            if now - last > limit and n.answering:
                n.answering = False
                n.silent_since = last
                why = f": {n.error}" if n.error else ""
                self.events.append(f"node {n.label} is not answering (nothing for {seconds(now - last)}){why}")
                for r in self.ranks.values():
                    if r.node == n.label and r.status != "exited":
                        r.status = "unknown"

    def _progressing(self, r: RankTrack, now: float) -> bool:
        return now - r.last_progress <= max(3 * self.interval, self.stall / 4)

    def _stack_pool(self, live: list[RankTrack], now: float) -> tuple[list[RankTrack], bool, int, int]:
        """The ranks with enough stack samples, whether all of them progress, and their samples and waits
        in all: counted once a round, each rank's peers are these less itself."""
        sampled = [o for o in live if len(o.stacks) >= MIN_STACK_SAMPLES]
        return (sampled, all(self._progressing(x, now) for x in sampled), sum(len(o.stacks) for o in sampled),
                sum(sum(s.in_collective for s in o.stacks) for o in sampled))

    def _stack_straggler(self, r: RankTrack, pool: tuple[list[RankTrack], bool, int, int]) -> str | None:
        """Why `r` is a lockstep straggler (its peers wait for it in collectives), or None."""
        sampled, progressing, n_all, w_all = pool
        if len(r.stacks) < MIN_STACK_SAMPLES:
            return None
        if len(sampled) < 2 or not progressing:
            return None
        n_r, w_r = len(r.stacks), sum(s.in_collective for s in r.stacks)
        n_o, w_o = n_all - n_r, w_all - w_r
        p_r, p_o = w_r / n_r, w_o / n_o
        if p_o < STRAGGLER_OTHERS_WAIT or p_r > STRAGGLER_OWN_WAIT:
            return None
        pooled = (w_r + w_o) / (n_r + n_o)
        se = math.sqrt(pooled * (1 - pooled) * (1 / n_r + 1 / n_o))
        if se == 0 or (p_o - p_r) / se < STRAGGLER_Z:
            return None
        places: dict[str, int] = {}
        for s in r.stacks:
            if not s.in_collective and s.where:
                places[s.where] = places.get(s.where, 0) + 1
        top = max(places, key=lambda k: places[k]) if places else None
        peers = _who([o for o in sampled if o is not r])
        return (f"{peers} waited in collectives in {w_o} of {n_o} stack samples, it in {w_r} of {n_r}"
                + (f" (mostly in {top}: {places[top]} of {n_r})" if top else ""))

    def evaluate(self, now: float) -> Incident | None:
        """Update every rank's status; the incident to act on now, if any (each rank/node reported once
        until it recovers)."""
        with gc_paused():  # 16k ranks judged: many small objects (core/gcpause.py)
            return self._evaluate(now)

    def _evaluate(self, now: float) -> Incident | None:
        self._judge_rates()
        self.check_nodes(now)
        watching = now - self.started >= self.grace
        live = [r for r in self.ranks.values() if r.status not in ("exited", "unknown")]
        exited = [r for r in self.ranks.values() if r.status == "exited"]
        # once a peer has exited, a rank that goes on without progress is not waiting for long: its
        # collective may time out and the launcher stop it before --stall would have passed
        stall = min(self.stall, max(3 * self.interval, EXITED_STALL_S)) if exited else self.stall
        stalled: list[RankTrack] = []
        stragglers: list[RankTrack] = []
        pool: tuple[list[RankTrack], bool, int, int] | None = None
        for r in live:
            idle = now - r.last_progress
            if watching and idle >= stall:
                if r.status != "stalled":
                    self.events.append(f"{r.label}: stalled, no progress for {seconds(idle)} "
                                       f"(last: {r.progress_why} at {clock(r.last_progress)})")
                r.status = "stalled"
                stalled.append(r)
                continue
            if r.status == "stalled":
                self.events.append(f"{r.label}: progressing again ({r.progress_why})")
                self.reported.discard(("stall", r.key))
            why = None
            if watching and self.factor > 0:
                if r.slow >= SLOW_SAMPLES:
                    why = r.straggler_why
                elif len(r.stacks) >= MIN_STACK_SAMPLES:  # (fewer: no verdict, and no pool to count)
                    if pool is None:
                        pool = self._stack_pool(live, now)
                    why = self._stack_straggler(r, pool)
            if why:
                if r.status != "straggler":
                    self.events.append(f"{r.label}: straggler: {why}")
                r.status, r.straggler_why = "straggler", why
                stragglers.append(r)
            else:
                if r.status == "straggler":
                    self.events.append(f"{r.label}: no longer a straggler")
                    self.reported.discard(("straggler", r.key))
                r.status = "ok"
        # a node that answered and then went silent (one that never answered is reported, not an incident:
        # its ranks were never seen, the watcher could not reach it from the start)
        silent = [n for n in self.nodes.values() if not n.answering and n.silent_since is not None
                  and n.last_sample is not None and watching and now - n.silent_since >= self.stall]
        new_stalled = [r for r in stalled if ("stall", r.key) not in self.reported]
        if new_stalled:
            for r in stalled:
                self.reported.add(("stall", r.key))
            since = min(r.last_progress for r in stalled)
            detail = (f"{_who(stalled)} made no progress for {seconds(now - since)} (since {clock(since)}); last "
                      "progress: " + "; ".join(f"{_who([r])}: {r.progress_why} at {clock(r.last_progress)}"
                                               for r in stalled[:4])
                      + (f"; and {len(stalled) - 4} more" if len(stalled) > 4 else "")
                      + (f"; {_who(exited)} exited ({'; '.join(r.signs[0] for r in exited[:4])})" if exited else ""))
            return Incident("stall", now, detail, [r.as_dict(now) for r in stalled],
                            sorted({r.node for r in stalled}), since, [r.as_dict(now) for r in exited])
        new_slow = [r for r in stragglers if ("straggler", r.key) not in self.reported]
        if new_slow:
            for r in stragglers:
                self.reported.add(("straggler", r.key))
            detail = "; ".join(f"{r.label} is a straggler: {r.straggler_why}" for r in stragglers)
            return Incident("straggler", now, detail, [r.as_dict(now) for r in stragglers],
                            sorted({r.node for r in stragglers}), None)
        new_silent = [n for n in silent if ("unreachable", n.label) not in self.reported]
        if new_silent:
            for n in silent:
                self.reported.add(("unreachable", n.label))
            detail = "; ".join(f"node {n.label} has not answered for {seconds(now - (n.silent_since or now))}"
                               + (f" ({n.error})" if n.error else "") for n in silent)
            ranks = [r.as_dict(now) for r in self.ranks.values() if r.node in {n.label for n in silent}]
            return Incident("unreachable", now, detail, ranks, [n.label for n in silent],
                            min(n.silent_since or now for n in silent))
        return None

    def requested(self, now: float) -> Incident:
        """The incident of ``--now``: collected on request, whatever the ranks do."""
        live = [r for r in self.ranks.values() if r.status != "exited"]
        return Incident("requested", now, f"collected on request (--now) while watching {_who(live) or 'no rank'}",
                        [r.as_dict(now) for r in live], sorted({r.node for r in live}), None)

    # -- views ----------------------------------------------------------------------------------
    def job_ended(self) -> bool:
        """Every rank that was seen has exited (and at least one was seen)."""
        return bool(self.ranks) and all(r.status == "exited" for r in self.ranks.values())

    def take_events(self) -> list[str]:
        out, self.events = self.events, []
        return out

    def status_line(self, now: float) -> str:
        live = [r for r in self.ranks.values() if r.status != "exited"]
        if not live:
            return "no rank process found yet"
        # (16k ranks: each pass at C speed)
        counts = Counter(map(operator.attrgetter("status"), live))
        idle = max(map(operator.sub, itertools.repeat(now), map(operator.attrgetter("last_progress"), live)))
        silent = [n.label for n in self.nodes.values() if not n.answering]
        return (f"{len(live)} rank(s) on {len(set(map(operator.attrgetter('node'), live)))} node(s): "
                + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
                + f"; longest without progress {seconds(idle)}"
                + (f"; not answering: {', '.join(silent)}" if silent else ""))

    def snapshot(self, now: float) -> dict[str, Any]:
        with gc_paused():
            return self._snapshot(now)

    def _snapshot(self, now: float) -> dict[str, Any]:
        ranks = list(self.ranks.values())
        # sorted again only when the ranks changed (the same objects in the same order: an identity test at C
        # speed; a rank's number, host and pid never change)
        if len(ranks) != len(self._seen_ranks) or not all(map(operator.is_, ranks, self._seen_ranks)):
            self._seen_ranks = ranks
            self._sorted_ranks = sorted(ranks, key=lambda r: (r.rank is None, r.rank or 0, r.host, r.pid))
        return {"ranks": [r.as_dict(now) for r in self._sorted_ranks],
                "nodes": [n.as_dict() for n in sorted(self.nodes.values(), key=lambda n: n.label)],
                "samples": self.samples, "stack_rounds": self.stack_rounds,
                "watched_s": round(now - self.started, 1)}
