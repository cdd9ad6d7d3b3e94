"""The launchers' own accounting names the rank of failures that no label names.

A worker's lines often carry no rank (torchrun without ``--tee``, a plain ``python -m
torch.distributed.launch``, a pod's console): its traceback is "unknown rank". The launcher that ran it
says more, after it: torchrun's agent prints ``failed (exitcode: 1) local_rank: 1 (pid: 42)``, sends
``closing signal SIGTERM`` to the healthy siblings, and its failure summary names the ``Root Cause``
with its global ``rank`` and ``local_rank``. The rules (issue 38), applied per source after identities
are resolved and before duplicates are merged:

1. torchrun's own traceback (run.py, launch.py, elastic/multiprocessing/errors) is its report, never a
   rank failing: blocks.py reads it as the failure summary it ends with.
2. When no worker line carries a rank, the agent decides: the one worker it says failed with an exit
   code (not one it stopped: the pids it sent ``closing signal`` are the healthy siblings) owns the
   unlabelled failures printed before its report; with several, the ``Root Cause`` entry owns them when
   they are one failure.
3. A world of one process (every rank and local rank said is 0) is rank 0.
4. Several agents: each summary's global rank is the fact (rule 2 per source); they are ordered by
   their ``time`` fields (verdict.py).
5. A hardware or CUDA error in an unlabelled traceback, and a ``[Rank N]`` c10d line (process group
   0) that carries the same error, are rank N's.
6. An agent's ``group_rank=G ... global_ranks=[...]`` says which global ranks its local ranks are
   (actions.py records it; verdict.Identities resolves with it).
7. NCCL's slow-path lines stay findings when quoted or flattened (repair.py, nccl.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from ml_debug.logs.result import PRIMARY, TIME_LAUNCHER, TIME_NEARBY, TIME_ORDER, Event, Who

_OWNED_KINDS = ("traceback", "exception", "cuda-error", "oom", "nccl-error", "shm", "gpu-fault", "signal",
                "error-line")
_HARDWARE = ("cuda-error", "gpu-fault", "nccl-error")


def _unlabelled(ev: Event) -> bool:
    return ev.who.rank is None and ev.who.local_rank is None


def _owned(ev: Event) -> bool:
    """A failure a worker printed itself (not a launcher's accounting of it)."""
    return ev.cls == PRIMARY and ev.kind in _OWNED_KINDS and "exit_code" not in ev.detail and _unlabelled(ev)


def _accounted(ev: Event) -> bool:
    """torchrun's accounting of a worker that failed on its own (an exit code, a crash; not a stop)."""
    via = ev.detail.get("via")
    if via not in ("torchrun", "torchrun summary") and "torchrun_root_cause" not in ev.detail:
        return False
    return ev.cls == PRIMARY and ev.detail.get("exit_code") not in (None, 0)


def _worker(ev: Event) -> tuple[int | None, int | None]:
    return ev.who.rank, ev.who.local_rank


def apply(events: list[Event], ranks_seen: Iterable[int]) -> None:
    """Give unlabelled failures the rank the launchers' accounting names (rules 2, 3 and 5), in place."""
    by_source: dict[int, list[Event]] = defaultdict(list)
    for ev in events:
        by_source[ev.source_index].append(ev)
    for evs in by_source.values():
        owned = [e for e in evs if _owned(e)]
        if owned and not _by_torchrun(evs, owned):
            _by_same_error(evs, owned)
    # rule 3: the logs say rank 0 and no other, and every local rank they say is 0: a world of one process
    if set(ranks_seen) == {0} and all(e.who.local_rank in (None, 0) for e in events):
        for e in events:
            if e.who.rank is None and e.kind != "launcher":
                _give(e, Who(0, e.who.node, e.who.local_rank), "world of one process (rank 0 only)", "rank_from")


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
    workers = {_worker(e) for e in failed if e.who.rank is not None} or {_worker(e) for e in failed}
    roots = [e for e in failed if e.detail.get("torchrun_root_cause")]
    report = max(e.offset for e in failed)
    before = [e for e in owned if e.offset <= report]
    if not before:
        return False
    if len(workers) == 1:
        owner = next((e for e in failed if e.who.rank is not None), failed[0])
        why = "torchrun's accounting (the one worker it says failed)"
    elif roots and len({e.message for e in before}) == 1:
        owner = roots[0]
        why = "torchrun's failure summary (its root cause)"
    else:
        return False
    # rule 4: when the failure's own time is only a lower bound (a line before it) or unknown, the agent's
    # report of it is the time that orders it against other agents' (its exit line to the millisecond, else
    # its summary's second)
    said = [e for e in failed if _worker(e) == _worker(owner) and e.time is not None]
    seen = min(said, key=lambda e: (e.time is not None and e.time % 1 == 0, e.time or 0.0), default=None)
    for e in before:
        _give(e, owner.who, why)
        if seen is not None and e.time_source in (TIME_NEARBY, TIME_ORDER):
            e.time, e.time_source = seen.time, TIME_LAUNCHER
    return True


def _by_same_error(evs: list[Event], owned: list[Event]) -> bool:
    """Rule 5: a CUDA or hardware error without a rank, and a ranked c10d line of the same error."""
    done = False
    for e in owned:
        cause = e.detail.get("cause", e.kind)
        if cause not in _HARDWARE:
            continue
        ranks = {o.who.rank for o in evs if o.who.rank is not None and o.label == e.label}
        if len(ranks) == 1:
            rank = next(iter(ranks))
            _give(e, Who(rank, None, None), f"rank {rank}'s own process-group line of the same error")
            done = True
    return done
