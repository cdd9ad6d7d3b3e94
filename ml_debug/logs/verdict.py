"""From events to the answer: duplicates merged, the first failure named, identical tracebacks collapsed
with their rank sets, and a timeline.

The first failure is the earliest primary event, strong evidence first (an exception, a CUDA error, a crash
by signal, an out-of-memory; a bare exit code only when nothing else exists). Earliest: by time stamp when
every candidate has one (its line's, its error file's, torchrun's summary's), else by position in the
logs, which only orders lines of one file. The verdict says which."""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable
from typing import Any

from ml_debug.core.ranges import compress
from ml_debug.core.ranges import ranks as ranks_text
from ml_debug.logs.catalogue import FAILURE_CLASSES, MPIRUN_BANNER, STEPS
from ml_debug.logs.events import Collector
from ml_debug.logs.labels import brief, clock
from ml_debug.logs.result import (
    CUT_SHORT,
    JOB_KINDS,
    PRIMARY,
    SECONDARY,
    TIME_ERROR_FILE,
    TIME_LAUNCHER,
    TIME_LINE,
    TIME_NEARBY,
    TIME_ORDER,
    WARNING,
    Event,
    TimelineRow,
    TracebackGroup,
    Verdict,
    Who,
)
from ml_debug.logs.text import few, numbers_aside, peer

MAX_TIMELINE = 60
_TYPE_PREFIX = re.compile(r"^\w+: ")
_BASIS = {TIME_LINE: "line time stamps", TIME_ERROR_FILE: "error file time stamps",
          TIME_LAUNCHER: "the launcher's report of the exit", TIME_ORDER: "file order",
          TIME_NEARBY: "the time stamps of the lines just before (a lower bound)"}
# Richer evidence first when the same failure is reported twice (a traceback and its error file ...).
_RICHNESS = {"traceback": 0, "error-file": 1, "cuda-error": 2, "oom": 2, "nccl-error": 2, "shm": 2, "init": 2,
             "signal": 3, "exception": 4, "error-line": 5, "watchdog": 6, "comm": 6, "slurm": 7, "exit": 8,
             "launcher": 9, "nccl-warn": 9}


def _identity_key(who: Who) -> tuple[Any, ...]:
    if who.rank is not None:
        return ("rank", who.rank)
    return ("node", who.node, who.local_rank) if who.local_rank is not None or who.node else ("unknown",)


def _ranks(events: Iterable[Event]) -> str:
    """The ranks of ``events`` that have one, as ranges (``0-3,7``)."""
    return compress({e.who.rank for e in events if e.who.rank is not None})


def _norm(message: str) -> str:
    return numbers_aside(_TYPE_PREFIX.sub("", message.strip()))[:160]


def _family(ev: Event) -> str:
    if ev.kind in ("exit", "signal") and "exit_code" in ev.detail:
        return f"exit:{ev.detail['exit_code']}"
    if ev.kind in ("comm", "watchdog") and ev.cls == SECONDARY:
        return "secondary-line"  # a peer's failure echoes in several lines of each rank: its first says it
    cause = ev.detail.get("cause", ev.kind)
    if cause in ("cuda-error", "oom", "nccl-error", "shm"):
        return f"{cause}:{ev.label}"  # c10d's log line and the traceback report the same CUDA error
    if ev.kind in ("traceback", "error-file", "exception", "error-line", "cuda-error", "oom", "nccl-error", "shm"):
        # a retry's logged copy and the last one, raised, are two: the second is the failure
        return ("handled:" if "handled" in ev.detail else "failure:") + _norm(ev.message)
    return f"{ev.kind}:{ev.label}"


def dedupe(events: list[Event]) -> list[Event]:
    """One event per (writer, failure): a traceback, its error file and torchrun's copy are one; mpirun's banner
    (a process failed) is told by its line that names the process, when the file has it."""
    best: dict[tuple[Any, ...], Event] = {}
    for ev in events:
        key: tuple[Any, ...] = (_identity_key(ev.who), _family(ev))
        if ev.kind == "launcher":
            key = (*key, ev.source_index, ev.offset)
        old = best.setdefault(key, ev)
        if old is ev:
            continue
        keep, other = (ev, old) if _RICHNESS.get(ev.kind, 9) < _RICHNESS.get(old.kind, 9) else (old, ev)
        if other.time is not None and (keep.time is None
                                       or (other.time < keep.time and other.time_source == TIME_LINE)):
            keep.time, keep.time_source = other.time, other.time_source
        keep.text = keep.text or other.text
        sure = "rank_from" not in keep.detail  # its rank was said, not assumed: keep it that way
        keep.detail = {**other.detail, **keep.detail}
        if sure:
            keep.detail.pop("rank_from", None)
        keep.who = keep.who.merged(other.who)
        keep.strong = keep.strong or other.strong
        best[key] = keep
    told = {e.source_index for e in events if e.detail.get("via") == "mpirun"}
    return _one_end_per_writer([e for e in best.values() if e.label != MPIRUN_BANNER or e.source_index not in told])


def _one_end_per_writer(events: list[Event]) -> list[Event]:
    """A process ends once: a writer's uncaught exception and the signal its exit code then shows (gloo's
    abort as the interpreter exits, say) are one failure, told by the exception, the signal kept as its
    ``exit_code``."""
    raised: dict[tuple[Any, ...], Event] = {}
    for ev in events:
        if ev.kind in ("traceback", "error-file", "exception") and ev.strong and ev.cls == PRIMARY:
            raised.setdefault(_identity_key(ev.who), ev)
    out: list[Event] = []
    for ev in events:
        told = raised.get(_identity_key(ev.who)) if ev.kind == "signal" and "exit_code" in ev.detail else None
        if told is not None and _identity_key(ev.who) != ("unknown",):
            told.detail.setdefault("exit_code", ev.detail["exit_code"])
            continue
        out.append(ev)
    return out


# ----------------------------------------------------------------------------- causes per writer


def _cause(events: list[Event]) -> Event:
    """The event that says why this writer failed: its first strong primary, else its first strong
    secondary, its first primary, its first secondary (``events``: primaries and secondaries only). One
    without a time takes the earliest of the writer's other reports of its end (torchrun's summary, its
    error file): the failure happened no later than that."""
    cause = min(events,
                key=lambda e: (not e.strong, e.cls != PRIMARY, e.order_key(), _RICHNESS.get(e.kind, 9)))
    timed = [e for e in events if e.time is not None and e.cls == cause.cls]
    if cause.time is None and timed:
        first = min(timed, key=lambda e: e.time or 0.0)
        cause.time, cause.time_source = first.time, first.time_source
    return cause


def _earliest(cands: list[Event], what: str = "primary failure", roots: Collection[Any] = ()) -> tuple[Event, str]:
    """The earliest candidate, and how that was decided. Of one time and place (the entries of torchrun's failure
    summary, whose order says nothing), the one it names its root cause (``roots``: writers' identity keys)."""
    if len(cands) == 1:
        ev = cands[0]
        return ev, f"the only {what}" + (f" (time from {_BASIS[ev.time_source]})" if ev.time is not None else "")
    if all(e.time is not None for e in cands):
        ev = min(cands, key=lambda e: (e.time, e.order_key(), _identity_key(e.who) not in roots))
        return ev, " and ".join(sorted({_BASIS[e.time_source] for e in cands}))
    ev = min(cands, key=lambda e: e.order_key())
    if len({e.source_index for e in cands}) > 1:
        return ev, "file order (time stamps missing; the order across files is not known)"
    return ev, "file order (no time stamps)"


_ABOUT_RANK = re.compile(r"\bon rank (\d+)\b")


def _subject(first: Event, strong: list[Event], causes: Iterable[Event],
             world_size: int | None) -> tuple[Event, str] | None:
    """When the first failure says which other rank it is about ("non-finite loss on rank 1 at step 3",
    raised by every rank after a check they run together): that rank's own copy of it, or, when the
    launcher stopped that rank before it wrote one, the failure put on that rank; and why."""
    m = _ABOUT_RANK.search(first.message)
    if m is None or first.who.rank is None:
        return None
    subject = int(m.group(1))
    if world_size is not None and subject >= world_size:
        return None
    if subject == first.who.rank:  # its own copy came first: the others' are the same finding, not a tie
        same = any(c is not first and c.message == first.message for c in strong)
        return (first, f"every rank reported the same failure, about rank {subject}") if same else None
    own = next((c for c in strong if c.who.rank == subject and c.message == first.message), None)
    if own is not None:
        return own, f"every rank reported the same failure, about rank {subject}"
    who = next((c.who for c in causes if c.who.rank == subject), Who(subject, None, None))
    return (dataclasses.replace(first, who=who),
            f"rank {first.who.rank}'s error is about rank {subject}, which was stopped before it wrote its own")


def decide(events: list[Event], world_size: int | None, blamed: Iterable[int] = (),
           suspects: Iterable[Event] = ()) -> Verdict:
    """The verdict over deduplicated, resolved events (``suspects``: lines that only look like a failure)."""
    v = _decide(events, world_size, blamed, list(suspects))
    v.findings = _findings(events) + _stalls(events, world_size)
    if v.status == "none" and any(e.kind == "stall" for e in events):
        v.summary += "; but ranks waited for others (below): a hang, if the job never went on"
    if v.hint is None and v.primary is not None:
        v.hint = next_step(v.primary)
    return v


def _decide(events: list[Event], world_size: int | None, blamed: Iterable[int], suspects: list[Event]) -> Verdict:
    failures = [e for e in events if e.cls in (PRIMARY, SECONDARY)]
    if not failures and suspects:
        first, basis = _earliest(suspects, "line that looks like a failure")
        return Verdict(status="suspect", primary=first, basis=basis, confidence="low",
                       confidence_why="no failure line this tool knows: the first line that looks like one",
                       summary=f"no known failure line, but {len(suspects)} line(s) look like one; the "
                               f"first: {first.who.label()}{_at(first)}: {brief(first.message)}")
    if not failures:
        warnings = sum(1 for e in events if e.cls == WARNING)
        return Verdict(status="none",
                       summary="no failure found" + (f" ({warnings} warning(s))" if warnings else ""),
                       confidence="high", confidence_why="nothing in any file looks like a failure")
    by_writer: dict[tuple[Any, ...], list[Event]] = defaultdict(list)
    for e in failures:
        by_writer[_identity_key(e.who)].append(e)
    causes = [_cause(evs) for evs in by_writer.values()]
    strong = [c for c in causes if c.cls == PRIMARY and c.strong]
    weak = [c for c in causes if c.cls == PRIMARY and not c.strong]
    failed_ranks = {c.who.rank for c in causes if c.who.rank is not None}
    missing = sorted(set(range(world_size or 0)) - failed_ranks)
    silent = compress(missing) if missing and len(missing) < (world_size or 0) else None
    blamed_text = compress(blamed) or None
    if not strong and not weak:
        top, basis = _earliest(causes, "failure")
        if top.kind == "slurm":  # Slurm cancelled the step, and nothing had failed before: it was stopped from outside
            top.cls, top.strong = PRIMARY, True
            top.message += ": no task had failed before it (scancel, or the scheduler)"
            strong = [top]
    if not strong and not weak:
        ranks = compress(failed_ranks)
        who = ranks_text(ranks) if ranks else ", ".join(sorted({c.who.label() for c in causes}))
        summary = f"no primary failure found: {who} failed only as a consequence of a peer ({_tally(causes)})"
        hints = []
        if silent:
            summary += f"; {ranks_text(silent)} left no failure in the logs"
            hints.append(f"rank(s) {silent} may have hung or died without a trace: `mldebug dump-stacks` "
                         "while the job runs, the Flight Recorder, or the node's kernel log (OOM killer)")
        lost = peers_lost(causes)
        if lost:
            summary += f"; they lost their connection to {lost}"
            hints.append(f"the process at {lost} failed or its node went down first: that node's logs (the console of "
                         "its ranks, its kernel log: dmesg -T, an OOM kill, a reboot) say why")
        hints += _steps_by_writers(causes)
        if blamed_text:
            summary += f"; peers name rank(s) {blamed_text}"
        return Verdict(status="secondary-only", summary=summary, basis=basis, hint="; ".join(hints) or None,
                       secondary=_secondary_rows(causes), silent_ranks=silent, blamed_ranks=blamed_text, peers_lost=lost,
                       confidence="low", confidence_why="only consequences of a peer's failure were found: "
                                                        "the cause is not in these logs")
    roots = {_identity_key(e.who) for e in failures if e.detail.get("torchrun_root_cause")}
    cands = strong or weak
    if strong and all(e.time is not None for e in strong):
        # an exit code a second or more before every message (torchrun's summary: exit code 1 at 13:02:58, a SIGKILL
        # of its own 30 s later) came first: its time bounds it from above, theirs from below. (Not a logger's
        # mention of an exception: the program may have gone on.)
        start = min(e.time for e in strong if e.time is not None)
        # (torchrun's root cause, its entry cut before its exit code, is such an exit)
        cands = strong + [e for e in weak if ("exit_code" in e.detail or e.detail.get("torchrun_root_cause"))
                          and e.time is not None and e.time <= start - 1]
    first, basis = _earliest(cands, roots=roots)
    about = _subject(first, strong, causes, world_size)
    if about is not None:
        first, basis = about
    unplaced = first
    if first.who.rank is None and len(missing) == 1 and failed_ranks and first.kind not in JOB_KINDS:
        # a failure without its rank (CUDA's unprefixed out-of-memory, DeepSpeed's return code) is put on the
        # one rank that reported nothing else (the others' watchdog and connection errors name themselves)
        first = dataclasses.replace(first, who=Who(missing[0], first.who.node, first.who.local_rank),
                                    detail={**first.detail, "rank_from": "only rank of the job that reported "
                                            "no failure of its own (the others name themselves)"})
    tie = [] if about is not None else [e for e in _tie(first, cands) if e is not unplaced]
    # every rank's same finding about one rank is one failure; the launcher then stopping that rank is no news
    same = [c for c in causes if c is not first and about is not None and c.message == first.message]
    others = [c for c in causes if c is not first and c is not unplaced and c not in same
              and not (about is not None and c.who.rank == first.who.rank and c.cls == SECONDARY)]
    independent = sorted((c for c in others if c.cls == PRIMARY and c.strong and c not in tie),
                         key=lambda e: e.order_key())
    after = [c for c in others if (c.cls != PRIMARY or not c.strong) and c not in tie]
    who = first.who.label() if first.who.known or first.kind not in JOB_KINDS else "the job"
    summary = f"first failure: {who}{_at(first)}: {brief(first.message)}"
    if tie:
        tied = sorted([first, *tie], key=lambda e: (e.who.rank is None, e.who.rank or 0, e.order_key()))
        root = next((e.who.label() for e in tied if _identity_key(e.who) in roots), None)
        picks = [] if root == first.who.label() else [f"the first in the logs: {first.who.label()}"]
        picks += [f"torchrun's 'Root Cause' picks {root}"] if root else []
        said = f"failed in the same second{_at(first)}; which came first is not known ({'; '.join(picks)})"
        if len({_norm(e.message) for e in tied}) == 1:  # one message (an exit code, a check every rank runs)
            summary = f"tie: {_writers(tied)} {said}: {brief(first.message)}"
        else:
            summary = (f"tie: {', '.join(e.who.label() for e in tied)} {said}: "
                       + "; ".join(f"{e.who.label()}: {brief(e.message)}" for e in tied))
    tail = [f"{ranks_text(_ranks(same))} reported the same"] if same else []
    if after:
        after_ranks = _ranks(after)
        unknown = sum(1 for c in after if c.who.rank is None)
        who = " and ".join(filter(None, [ranks_text(after_ranks) if after_ranks else "",
                                         f"{unknown} unattributed writer(s)" if unknown else ""]))
        tail.append(f"{who} failed after it: {_tally(after)}")
    if independent:
        tail.append(f"{len(independent)} other rank(s) failed on their own: "
                    + few((f"{e.who.label()}: {brief(e.message)}" for e in independent), 3, "; "))
    if tail:
        summary += " (" + "; ".join(tail) + ")"
    if silent and first.who.rank is not None and first is not unplaced:  # placed by elimination: not silent
        silent = compress(set(missing) - {first.who.rank}) or None
    confidence, why = _confidence(first, basis, tie)
    return Verdict(status="failure", summary=summary, primary=first, basis=basis,
                   secondary=_secondary_rows(after), independent=independent, silent_ranks=silent,
                   blamed_ranks=blamed_text, confidence=confidence, confidence_why=why,
                   tie=_ranks([first, *tie]) or None if tie else None)


def _writers(events: list[Event]) -> str:
    """Who ``events`` are: their ranks as ranges when each has one (``ranks 0-3``), else their labels."""
    if all(e.who.rank is not None for e in events):
        return ranks_text(_ranks(events))
    return few((e.who.label() for e in events), 6)


def _at(ev: Event) -> str:
    """When ``ev`` happened: its time, or when a launcher reported it (the failure came no later)."""
    if ev.time is None:
        return ""
    return f", reported at {clock(ev.time)}" if ev.time_source == TIME_LAUNCHER else f" at {clock(ev.time)}"


def _confidence(first: Event, basis: str, tie: list[Event]) -> tuple[str, str]:
    """How sure the first failure is, and why."""
    if tie:
        return "low", "a tie: another rank failed in the same second"
    why = [text for said, text in (
        (not first.strong, "only a log line names it, in passing (the program may have caught it)"
         if first.kind == "exception" else "only an exit code or a kill says it (no message of its own)"),
        (first.who.rank is None and first.kind not in JOB_KINDS,
         "its global rank is not in the logs" if first.who.local_rank is not None or first.who.node
         else "the logs do not say which rank"),
        (bool(first.detail.get("rank_from")), f"rank from the {first.detail.get('rank_from')}"),
        (bool(first.detail.get("logged")), f"its traceback came {first.detail.get('logged')}"),
        (first.message == CUT_SHORT, "its traceback ends before its exception: what failed is not in the logs")) if said]
    level = "medium" if why else "high"
    if basis.startswith("file order (time stamps missing; the order across files"):
        level = "medium" if level == "high" else "low"
        why.append("several files without time stamps: their order is not known")
    if not why:
        why.append("the only primary failure" if basis.startswith("the only") else f"ordered by {basis}")
    return level, "; ".join(why)


def _tie(first: Event, cands: list[Event]) -> list[Event]:
    """Other writers' failures in the same second as ``first``, where times are only known to the second
    (torchrun's summary, whole-second stamps): the order between them is not known."""
    t = first.time
    if t is None:
        return []
    out = [e for e in cands if e is not first and e.time is not None and int(e.time) == int(t)
           and _identity_key(e.who) != _identity_key(first.who)
           and (TIME_LAUNCHER in (e.time_source, first.time_source) or (e.time % 1 == 0 and t % 1 == 0))]
    return sorted(out, key=lambda e: e.order_key())


_GPU = re.compile(r"\bGPU (\d+)\b")
_DEVICE_ASSERT = re.compile(r"device-side assert", re.I)
# the processes a CUDA out-of-memory error lists on its GPU (c10's CUDACachingAllocator, from NVML: "Process 6680 has
# 1.81 GiB memory in use. Including non-PyTorch memory, this process has 11.21 GiB memory in use.")
_GPU_PROCESS = re.compile(r"Process (\d+) has ([\d.]+ [KMGT]?i?B) memory in use")
_OWN_KINDS = ("watchdog", "cuda-error", "oom", "gpu-fault", "shm")
"""Kinds that are their events' own cause, which may be told in words of no class of theirs (srun's out of memory, a
CUDA error in c10d's line): they take their kind's first next step."""
_STEPS = tuple((step.kinds, re.compile(step.pattern), step.hint) for step in STEPS)


def _steps_by_writers(causes: list[Event]) -> list[str]:
    """Each consequence's own next step (NCCL's watchdog: raised far from the cause; a rank that never joined), once
    for all the writers it is the step of."""
    by_step: dict[str | None, list[Event]] = {}
    for c in causes:
        by_step.setdefault(next_step(c, who="\0"), []).append(c)
    return [step.replace("\0", _writers(group)) if len(group) > 1 else str(next_step(group[0]))
            for step, group in by_step.items() if step]


def peers_lost(events: Iterable[Event]) -> str | None:
    """The addresses the connection errors of ``events`` say their peer had (gloo's, NCCL's), the most named first; not
    a loopback address, which only says the peer was on the same node."""
    said = Counter(p for e in events if (p := peer(e.message)) and not p.startswith(("127.", "::1", "localhost")))
    return few((p for p, _ in said.most_common()), 3) if said else None


def next_step(ev: Event, who: str | None = None) -> str | None:
    """What to do about the cause ``ev`` names: its failure class's next step, else the step for what no class names
    (a crash by its signal, an exit code alone, a stop by the scheduler: catalogue.py); ``who``: its writers, when
    not its own."""
    text = ev.label + " " + ev.message
    kind = ev.kind if ev.kind in _OWN_KINDS else ev.detail.get("cause", ev.kind)
    if "NCCL operations have failed or timed out" in text:
        kind = "watchdog"
    if ev.detail.get("exit_code") == -11 or "SIGSEGV" in text:
        kind = "signal"
    entries = [c for c in FAILURE_CLASSES if c.kind == kind and c.hint]
    # its own class (a label with {what} is said with the text in its place); else, for a memory, CUDA or hardware
    # error or a watchdog named in other words, its kind's first
    entry = next((c for c in entries if c.label == ev.label or ("{what}" in c.label
                                                                 and ev.label.startswith(c.label.split("{what}")[0]))),
                 entries[0] if entries and kind in _OWN_KINDS else None)
    hint = entry.hint if entry is not None else next(
        (hint for kinds, rx, hint in _STEPS if kind in kinds and rx.search(text)), None)
    if hint is None:
        return None
    gpu = _GPU.search(ev.message)
    dsa = " and TORCH_USE_CUDA_DSA=1, which names the failing assert" if _DEVICE_ASSERT.search(text) else ""
    who = who or ev.who.label()
    return hint.format(who="the failing process" if who == "unknown rank" else who,
                       gpu=f" (GPU {gpu.group(1)})" if gpu else "", dsa=dsa, others=_others_on_gpu(ev.message))


def _others_on_gpu(message: str) -> str:
    """The other processes a CUDA out-of-memory error says held memory on its GPU, and what that most often means.
    One process listed without "this process" is the failing one itself, seen from a container (another pid)."""
    procs = _GPU_PROCESS.findall(message)
    if not procs or (len(procs) == 1 and "this process has" not in message):
        return ""
    return (f". Other processes held memory on that GPU too ({few((f'pid {pid}: {size}' for pid, size in procs), 3)}): "
            "another rank on the same GPU (each rank must call torch.cuda.set_device(LOCAL_RANK) before it "
            "allocates), another job, or a process left from an earlier run (nvidia-smi on that node)")


def _findings(events: list[Event]) -> list[str]:
    """Problems that are not failures: NCCL without InfiniBand because libibverbs did not load."""
    fallback = [e for e in events if e.kind == "nccl-fallback"]
    if not fallback:
        return []
    where = _ranks(fallback)
    nodes = sorted({e.who.node for e in fallback if e.who.node})
    on = ranks_text(where) if where else (", ".join(nodes[:5]) or "some ranks")
    return [f"NCCL fell back to TCP sockets on {on}: libibverbs failed to load, so the job runs, slowly, without "
            "InfiniBand/RoCE. Install libibverbs (rdma-core) in the image and expose /dev/infiniband to the "
            "container; check NCCL_IB_HCA, NCCL_IB_DISABLE and that `ibv_devinfo` lists the HCAs"]


def _stalls(events: list[Event], world_size: int | None) -> list[str]:
    """Lines that say ranks waited for others (Horovod's stall inspector, a store barrier at init), per kind of line:
    findings, since a healthy job prints them when a rank is late; the ranks that were waited for, where they say."""
    out = []
    stalls = [e for e in events if e.kind == "stall" and e.cls == WARNING]  # (a rank Horovod shut down for: a failure)
    for label in dict.fromkeys(e.label for e in stalls):
        mine = [e for e in stalls if e.label == label]
        ready = [{int(x) for x in str(e.detail["ready"]).replace(",", " ").split()} for e in mine if e.detail.get("ready")]
        world = max([world_size or 0, *(max(r) + 1 for r in ready if r)])
        said = {int(x) for e in mine for x in str(e.detail.get("missing", "")).split(",") if x}  # Horovod 0.21+
        missing = compress(said | (set(range(world)) - ready[0].intersection(*ready[1:]) if ready else set()))
        if missing:
            out.append(f"{mine[0].message}; they waited for {ranks_text(missing)}: if the job hung, look there first")
        else:
            out.append(f"{mine[0].message}: if the job hung, the ranks that never came are the cause (their own "
                       "logs, or their nodes', say why)")
    return out


def _label_counts(events: Iterable[Event]) -> list[tuple[str, int]]:
    """Each label and how many events have it, the most common first."""
    return sorted(Counter(e.label for e in events).items(), key=lambda kv: (-kv[1], kv[0]))


def _tally(events: Iterable[Event]) -> str:
    return ", ".join(f'{n} x "{label}"' for label, n in _label_counts(events))


def _secondary_rows(events: Collection[Event]) -> list[dict[str, Any]]:
    return [{"label": label, "count": n, "ranks": _ranks(e for e in events if e.label == label)}
            for label, n in _label_counts(events)]


# ----------------------------------------------------------------------------- tracebacks and timeline


def _signature(lines: list[str]) -> str:
    out = []
    for line in lines:
        s = line.strip()
        if not s or s.startswith("^") or set(s) <= {"^", "~", " "}:
            continue
        # a frame by its file's name: the same code in two venvs is the same frame
        out.append(s.rsplit("/", 1)[-1] if s.startswith('File "') else numbers_aside(s))
    return "\n".join(out)


def _made_at(e: Event) -> tuple[Any, ...]:
    """Where and what an event is, its rank aside."""
    return e.source_index, e.offset, e.line, e.kind, e.message, e.who.node, e.who.local_rank


def placed(events: list[Event], primary: Event | None) -> list[Event]:
    """``events`` with the verdict's first failure in place of the event without a rank it was made from (its rank
    placed by elimination), so that every view names the rank the verdict names."""
    if primary is None or primary.who.rank is None:
        return events
    at = _made_at(primary)
    i = next((i for i, e in enumerate(events) if e.who.rank is None and _made_at(e) == at), None)
    return events if i is None else [*events[:i], primary, *events[i + 1:]]


def collapse_tracebacks(events: list[Event]) -> list[TracebackGroup]:
    """Identical tracebacks (numbers, addresses and install paths aside), with their rank sets."""
    groups: dict[str, list[Event]] = {}
    for e in events:
        if e.text and e.kind in ("traceback", "error-file") and e.cls in (PRIMARY, SECONDARY):
            groups.setdefault(_signature(e.text), []).append(e)
    out = []
    for members in groups.values():
        first = min(members, key=lambda e: e.order_key())
        out.append(TracebackGroup(ranks=_ranks(members), count=len(members), cls=first.cls, message=first.message,
                                  text=first.text, who=sorted({e.who.label() for e in members if e.who.rank is None})))
    return sorted(out, key=lambda g: (g.cls != PRIMARY, -g.count))


def timeline(events: list[Event]) -> list[TimelineRow]:
    """Failures in order, alike neighbours merged into one row with their rank set. One file: its own order
    (the times shown where lines have them). Several files: the events with a time stamp by time, then the
    others grouped by what they say (their order across files is unknown)."""
    strong_writers = {_identity_key(e.who) for e in events if e.cls in (PRIMARY, SECONDARY) and e.strong}
    # a bare exit code or a kill by the launcher of a writer that said more is not a step of its own
    evs = [e for e in events if (e.cls in (PRIMARY, SECONDARY) and (e.strong or _identity_key(e.who)
                                                                     not in strong_writers)) or e.kind == "launcher"]
    if len({e.source_index for e in evs}) <= 1:
        return _merged(sorted(evs, key=lambda e: e.order_key()))[:MAX_TIMELINE]
    timed = sorted((e for e in evs if e.time is not None), key=lambda e: (e.time, e.order_key()))
    untimed: dict[tuple[str, str], list[Event]] = {}
    for e in sorted((e for e in evs if e.time is None), key=lambda e: e.order_key()):
        untimed.setdefault((e.label, e.cls), []).append(e)
    return (_merged(timed) + [row for group in untimed.values() for row in _merged(group)])[:MAX_TIMELINE]


def _merged(evs: list[Event]) -> list[TimelineRow]:
    """Alike neighbours (one label, one class) as one row: the first's message, the first time known."""
    rows = []
    for _, group in itertools.groupby(evs, key=lambda e: (e.label, e.cls)):
        run = list(group)
        timed = [e for e in run if e.time is not None]
        start = timed[0] if timed else run[0]
        rows.append(TimelineRow(time=start.time, time_source=start.time_source if timed else TIME_ORDER,
                                last_time=max((e.time for e in timed if e.time is not None), default=None),
                                cls=run[0].cls, label=run[0].label, message=run[0].message, ranks=_ranks(run),
                                who=few(sorted({_writer(e) for e in run if e.who.rank is None}), 3),
                                count=len(run)))
    return rows


def _writer(e: Event) -> str:
    return ("torchrun" + (f" on {e.who.node}" if e.who.node else "")) if e.kind == "launcher" else e.who.label()


def progress(c: Collector, metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """How far each rank got: mldebug train's step per rank, NCCL's last completed collective per rank."""
    out: dict[str, Any] = {}
    metric = {m["rank"]: m for m in metrics if isinstance(m.get("step"), int)}
    if metric:
        last = max((m["time"] for m in metric.values() if isinstance(m.get("time"), float)), default=None)
        out["train"] = _reached({r: m["step"] for r, m in metric.items()}, "max_step", "steps",
                                last_time=last)
    if c.last_work:
        out["nccl_work"] = _reached({r: w[1] for r, w in c.last_work.items()}, "max_completed", "completed")
    return out


def _reached(counts: dict[int, int], top: str, each: str, **more: Any) -> dict[str, Any]:
    """The ranks, the highest count (``top``), the ranks below it, ``more``, each rank's count (``each``)."""
    high = max(counts.values())
    return {"ranks": compress(counts), top: high,
            "behind": compress(r for r, n in counts.items() if n < high),
            **more, each: {str(r): n for r, n in sorted(counts.items())}}
