"""Who wrote each failure: what the lines said about who is who (:class:`Identities`), and the launchers'
accounting, which names the rank of failures no label names.

A worker's lines often carry no rank (torchrun without ``--tee``, a plain ``python -m
torch.distributed.launch``, a pod's console): its traceback is "unknown rank". The launcher says more, after
it: torchrun's agent prints ``failed (exitcode: 1) local_rank: 1 (pid: 42)``, sends ``closing signal SIGTERM``
to the healthy siblings, and its failure summary names the ``Root Cause`` with its ``rank`` and
``local_rank``. The rules (issue 38), per source, after identities are resolved and before duplicates merge:

1. torchrun's own traceback (run.py, launch.py, elastic/multiprocessing/errors) is its report, never a rank
   failing: blocks.py reads it as the failure summary it ends with.
2. When no worker line carries a rank, the one worker the agent says failed with an exit code (not one it
   stopped: the pids it sent ``closing signal`` are healthy) owns the unlabelled failures printed before its
   report; with several, the ``Root Cause`` entry owns them when they are one failure.
3. A world of one process (every rank and local rank said is 0) is rank 0.
4. Several agents: each summary's global rank is the fact (rule 2 per source); their ``time`` fields order
   them (verdict.py).
5. A hardware or CUDA error in an unlabelled traceback, and a ``[Rank N]`` c10d line (process group 0) with
   the same error, are rank N's.
6. An agent's ``group_rank=G ... global_ranks=[...]`` says which global ranks its local ranks are (actions.py
   records it; :class:`Identities` resolves with it).
7. NCCL's slow-path lines stay findings when quoted or flattened (repair.py, nccl.py).

And a SIGABRT exit torchrun reports after the NCCL watchdog said it takes the process down is that abort: a
consequence of the collective that timed out, not a crash of its own.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

from ml_debug.logs.events import Collector
from ml_debug.logs.result import (
    JOB_KINDS,
    PRIMARY,
    SECONDARY,
    TIME_LAUNCHER,
    TIME_NEARBY,
    TIME_ORDER,
    Event,
    Who,
)

_OWNED_KINDS = ("traceback", "exception", "cuda-error", "oom", "nccl-error", "shm", "gpu-fault", "signal",
                "error-line", "init")
_HARDWARE = ("cuda-error", "gpu-fault", "nccl-error")


class Identities:
    """Fills in the rank and node of events from what every line said about who is who."""

    def __init__(self, c: Collector) -> None:
        self.c = c
        self.single_node = len(c.nodes_seen) <= 1
        self.assumed = False
        """Whether the last :meth:`resolve` took a local rank for the rank (one node, no better source)."""
        pairs = {pair for per_source in c.local_rank_pairs.values() for pair in per_source.items()}
        paired = Counter(local for local, _ in pairs)
        self.pairs = {local: rank for local, rank in pairs if paired[local] == 1}
        # one node for sure: in every pair torchrun's summary (or a label) gave, the local rank is the rank
        self.one_node = self.single_node and bool(pairs) and all(local == rank for local, rank in pairs)
        on_node = Counter(c.rank_node.values())
        self.only_rank = {n: r for r, n in c.rank_node.items() if on_node[n] == 1}

    def resolve(self, who: Who, source_index: int) -> Who:
        """``who`` with its rank filled in where the logs say it; a local rank stays one unless they do (a
        ``[default3]:`` of a job of several nodes is not rank 3)."""
        c, rank, local, node = self.c, who.rank, who.local_rank, who.node
        self.assumed = False
        if rank is None and local is not None:
            if node and (node, local) in c.node_local_rank:
                rank = c.node_local_rank[(node, local)]
            elif local in c.local_rank_pairs.get(source_index, {}):
                rank = c.local_rank_pairs[source_index][local]
            elif self.single_node and local in self.pairs:
                rank = self.pairs[local]  # another file of the same agent says it
            elif self.one_node:
                rank, self.assumed = local, True  # one node: torchrun's local rank is the rank
        if rank is None and local is None and node:
            rank = self.only_rank.get(node)  # the only rank seen on that node (pdsh, srun: one rank per node)
        if node in c.srun_hosts and (rank is not None
                                     or list(c.srun_hosts.values()).count(c.srun_hosts[node]) == 1):
            # an agent under srun --label: its summary named its host (two agents of one host stay apart
            # while only their local ranks are known)
            node = c.srun_hosts[node]
        if node is None and rank is not None:
            node = c.rank_node.get(rank) or c.nccl.rank_host.get(rank)
        return Who(rank, node, local)


def _owned(ev: Event) -> bool:
    """A failure a worker printed itself (not a launcher's accounting of it), without a rank or local rank."""
    return (ev.cls == PRIMARY and ev.kind in _OWNED_KINDS and "exit_code" not in ev.detail
            and ev.who.rank is None and ev.who.local_rank is None)


def _accounted(ev: Event) -> bool:
    """torchrun's accounting of a worker that failed on its own (an exit code, a crash; not a stop)."""
    torchrun = ev.detail.get("via") in ("torchrun", "torchrun summary") or "torchrun_root_cause" in ev.detail
    return torchrun and ev.cls == PRIMARY and ev.detail.get("exit_code") not in (None, 0)


def _worker(ev: Event) -> tuple[int | None, int | None]:
    return ev.who.rank, ev.who.local_rank


def apply(events: list[Event], ranks_seen: Iterable[int]) -> None:
    """Give unlabelled failures the rank the launchers' accounting names (rules 2, 3 and 5), in place."""
    by_source: dict[int, list[Event]] = defaultdict(list)
    for ev in events:
        by_source[ev.source_index].append(ev)
    for evs in by_source.values():
        _watchdog_aborts(evs)
        owned = [e for e in evs if _owned(e)]
        if owned and not _by_torchrun(evs, owned):
            _by_same_error(evs, owned)
    # rule 3: the logs say rank 0 and no other, and every local rank they say is 0: a world of one process
    if set(ranks_seen) == {0} and all(e.who.local_rank in (None, 0) for e in events):
        for e in events:
            if e.who.rank is None and e.kind not in JOB_KINDS:
                _give(e, Who(0, e.who.node, e.who.local_rank), "world of one process (rank 0 only)", "rank_from")


def _watchdog_aborts(evs: list[Event]) -> None:
    """torchrun's SIGABRT exits after the watchdog's lines of the same source: the watchdog's abort, a consequence."""
    dog = min((e.offset for e in evs if e.kind == "watchdog"), default=None)
    for e in evs:
        if dog is not None and e.offset > dog and e.detail.get("exit_code") == -6 and _accounted(e):
            e.cls, e.strong = SECONDARY, False
            e.detail["abort_by"] = "the NCCL watchdog, which took the process down after a collective timed out"


def _give(ev: Event, who: Who, why: str, key: str = "rank_by") -> None:
    """``ev`` is ``who``'s; ``why`` goes into its detail: ``rank_by`` (a launcher said it) or ``rank_from`` (taken
    as the likely one: the verdict is less sure)."""
    ev.who = Who(who.rank, ev.who.node or who.node, who.local_rank)
    ev.detail[key] = why


def _by_torchrun(evs: list[Event], owned: list[Event]) -> bool:
    """Rule 2: the one worker torchrun says failed (or its Root Cause) owns the unlabelled failures."""
    stopped = {e.detail["pid"] for e in evs if e.kind == "launcher" and "pid" in e.detail}
    failed = [e for e in evs if _accounted(e) and e.detail.get("pid") not in stopped
              and (e.who.rank is not None or e.who.local_rank is not None)]
    if not failed:
        return False
    report = max(e.offset for e in failed)
    before = [e for e in owned if e.offset <= report]
    if not before:
        return False
    roots = [e for e in failed if e.detail.get("torchrun_root_cause")]
    if len({_worker(e) for e in failed if e.who.rank is not None} or {_worker(e) for e in failed}) == 1:
        owner = next((e for e in failed if e.who.rank is not None), failed[0])
        why = "torchrun's accounting (the one worker it says failed)"
    elif roots and len({e.message for e in before}) == 1:
        owner, why = roots[0], "torchrun's failure summary (its root cause)"
    else:
        return False
    # rule 4: when the failure's own time is a lower bound (a line before it) or unknown, the agent's report
    # of it orders it against other agents' (its exit line to the millisecond, else its summary's second)
    said = [e for e in failed if _worker(e) == _worker(owner) and e.time is not None]
    seen = min(said, key=lambda e: (e.time is not None and e.time % 1 == 0, e.time or 0.0), default=None)
    for e in before:
        _give(e, owner.who, why)
        if seen is not None and e.time_source in (TIME_NEARBY, TIME_ORDER):
            e.time, e.time_source = seen.time, TIME_LAUNCHER
    return True


def _by_same_error(evs: list[Event], owned: list[Event]) -> None:
    """Rule 5: a CUDA or hardware error without a rank, and a ranked c10d line of the same error."""
    for e in owned:
        if e.detail.get("cause", e.kind) in _HARDWARE:
            ranks = {o.who.rank for o in evs if o.who.rank is not None and o.label == e.label}
            if len(ranks) == 1:
                (rank,) = ranks
                _give(e, Who(rank, None, None), f"rank {rank}'s own process-group line of the same error")
