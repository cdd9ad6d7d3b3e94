"""Slurm accounting of a job, per step and node, joined to the ranks (task id = rank under srun).

Pure functions over text: :data:`SACCT_FIELDS` is what ``sacct -j J --parsable2 --noheader`` is asked
for and :func:`parse_sacct` reads it; :func:`parse_events` reads ``sacctmgr show event`` (which node went
down, why, when); :func:`judge` says what the accounting alone makes of the job: the step that failed,
its state (FAILED, OUT_OF_MEMORY, NODE_FAIL, TIMEOUT, CANCELLED by whom), exit code and signal, the rank
and node with the largest memory, and each task's node.

On clusters without cgroups (``JobAcctGatherParams=OverMemoryKill``), a step over its memory is
cancelled by Slurm's own poll and recorded ``CANCELLED by 0``, not OUT_OF_MEMORY: a cancelled step whose
MaxRSS reached its memory limit is judged out of memory too, and the judgement says on what grounds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ml_debug.remote.hostlist import expand_hostlist

SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "DerivedExitCode", "NodeList", "NNodes", "NTasks",
                "Layout", "MaxRSS", "MaxRSSNode", "MaxRSSTask", "ReqMem", "AllocCPUS", "Start", "End",
                "Elapsed", "WorkDir", "User", "Reason", "Timelimit", "Partition")
EVENT_FIELDS = ("NodeName", "Start", "End", "State", "Reason", "User")

FAILING_STATES = ("FAILED", "OUT_OF_MEMORY", "NODE_FAIL", "TIMEOUT", "CANCELLED", "BOOT_FAIL", "DEADLINE",
                  "PREEMPTED")
MAX_TASKS = 1 << 20
"""The most tasks a step's layout is worked out for (a damaged NTasks of billions is not)."""
OOM_FRACTION = 0.9
"""A cancelled step whose MaxRSS came within this fraction of its memory limit was killed for its memory."""

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


def size_bytes(text: str, default_unit: str = "") -> int | None:
    """``197720K`` -> bytes; ``100M``, ``4000Mn`` (per node), ``2Gc`` (per CPU, older Slurm) too."""
    m = re.fullmatch(r"\s*(\d{1,20}(?:\.\d{1,20})?)([KMGTP]?)([nc]?)\s*", text or "")
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2) or default_unit])


def size_text(n: int | None) -> str:
    """Bytes as Slurm writes them: 63.9G, 193M, 512K."""
    if n is None:
        return "?"
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.1f}{unit}" if v < 10 and v != int(v) else f"{v:.0f}{unit}"
    return f"{n}B"


def _time(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp() if text and text not in ("Unknown", "None") else None
    except ValueError:
        return None


def _number(text: str) -> int | None:
    """A count or a code as sacct writes it, or None (a damaged field: other digits, thousands of them)."""
    return int(text) if text.isdecimal() and len(text) <= 18 else None


def _exit(text: str) -> tuple[int | None, int | None]:
    code, _, sig = (text or "").partition(":")
    return _number(code), _number(sig)


@dataclass
class Step:
    """One line of sacct: the job itself (``step`` None), its batch step, or a step such as ``5.0``."""

    job_id: str
    step: str | None
    name: str
    state: str
    """FAILED, OUT_OF_MEMORY, NODE_FAIL, TIMEOUT, CANCELLED, COMPLETED, RUNNING ..."""
    cancelled_by: str | None
    exit_code: int | None
    signal: int | None
    nodes: list[str]
    ntasks: int | None
    layout: str | None
    max_rss: int | None
    max_rss_node: str | None
    max_rss_task: int | None
    req_mem: int | None
    """The memory limit it ran under, in bytes per node (the job's ReqMem shared out to its nodes)."""
    start: float | None
    end: float | None
    raw: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.job_id if self.step is None else f"{self.job_id}.{self.step}"

    @property
    def failed(self) -> bool:
        return self.state in FAILING_STATES or (self.exit_code not in (None, 0))

    def task_nodes(self) -> dict[int, str]:
        """Task id (the rank, under srun) -> node, from the step's layout: block fills each node in turn,
        cyclic deals the tasks round the nodes. Empty when the layout is not known."""
        if not self.ntasks or not self.nodes or self.ntasks > MAX_TASKS:
            return {}
        n, k = self.ntasks, len(self.nodes)
        if k == 1:
            return dict.fromkeys(range(n), self.nodes[0])
        layout = (self.layout or "").lower()
        if layout.startswith("cyclic"):
            return {t: self.nodes[t % k] for t in range(n)}
        if layout.startswith("block") and n % k == 0:
            per = n // k
            return {t: self.nodes[t // per] for t in range(n)}
        return {}


@dataclass
class NodeEvent:
    """A node state change recorded by slurmdbd (``sacctmgr show event``): it went DOWN, was drained ..."""

    node: str
    start: float | None
    end: float | None
    state: str
    reason: str
    user: str


@dataclass
class Accounting:
    """What sacct (and sacctmgr's node events) say about one job."""

    job_id: str
    job: Step | None
    steps: list[Step]
    workdir: str | None = None
    user: str | None = None
    node_events: list[NodeEvent] = field(default_factory=list)


def parse_sacct(text: str, job_id: str) -> Accounting:
    """``sacct -j J --parsable2 --noheader -o <SACCT_FIELDS>``: the job line and its steps. A job requeued
    or run again under the same id (a reset cluster) has several job lines: the last one is kept, with its
    steps."""
    rows = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < len(SACCT_FIELDS):
            continue
        rows.append(dict(zip(SACCT_FIELDS, parts[:len(SACCT_FIELDS)], strict=True)))
    job: Step | None = None
    steps: list[Step] = []
    for row in rows:
        jid, _, step = row["JobID"].partition(".")
        if jid.split("_")[0] != job_id.split("_")[0] and jid != job_id:
            continue
        s = _step(row, jid, step or None)
        if s.step is None:
            job, steps = s, []  # a later record of the same id replaces the earlier one and its steps
        else:
            steps.append(s)
    if job is not None and job.req_mem is not None:
        # Slurm 22.05 writes the job's whole memory (each node's share times the nodes): a step's limit is per node
        nnodes = job.raw.get("NNodes", "")
        job.req_mem //= _number(nnodes) or 1
        for s in steps:
            s.req_mem = s.req_mem or job.req_mem
    return Accounting(job_id=job_id, job=job, steps=steps,
                      workdir=(job.raw.get("WorkDir") or None) if job else None,
                      user=(job.raw.get("User") or None) if job else None)


def _step(row: dict[str, str], jid: str, step: str | None) -> Step:
    state, _, by = row["State"].partition(" by ")
    code, sig = _exit(row["ExitCode"])
    nodes = expand_hostlist(row["NodeList"]) if row["NodeList"] and row["NodeList"] != "None assigned" else []
    task = row["MaxRSSTask"]
    ntasks = row["NTasks"]
    return Step(job_id=jid, step=step, name=row["JobName"], state=state.strip(), cancelled_by=by.strip() or None,
                exit_code=code, signal=sig, nodes=nodes, ntasks=_number(ntasks),
                layout=row["Layout"] or None, max_rss=size_bytes(row["MaxRSS"]),
                max_rss_node=row["MaxRSSNode"] or None, max_rss_task=_number(task),
                req_mem=size_bytes(row["ReqMem"], "M"), start=_time(row["Start"]), end=_time(row["End"]),
                raw=row)


def parse_events(text: str) -> list[NodeEvent]:
    """``sacctmgr -n -P show event ... format=<EVENT_FIELDS>``."""
    out = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < len(EVENT_FIELDS) or not parts[0]:
            continue
        row = dict(zip(EVENT_FIELDS, parts[:len(EVENT_FIELDS)], strict=True))
        out.append(NodeEvent(node=row["NodeName"], start=_time(row["Start"]), end=_time(row["End"]),
                             state=row["State"], reason=row["Reason"], user=row["User"]))
    return out


@dataclass
class AccountingJudgement:
    """What accounting alone says: the step that failed first, why, and where (rank and node when it can)."""

    state: str
    """The job's state (COMPLETED, FAILED, OUT_OF_MEMORY, NODE_FAIL ...)."""
    failed: bool
    cause: str | None
    """oom, node-fail, timeout, cancelled, exit, signal; None when nothing failed."""
    step: str | None
    rank: int | None
    node: str | None
    sentence: str
    """One sentence, e.g. ``step 12.0 ended OUT_OF_MEMORY (limit 64G, MaxRSS 63.9G, task 5 on node3)``."""
    task_nodes: dict[int, str] = field(default_factory=dict)
    """Rank -> node of the job's main step (the first srun step)."""
    detail: dict[str, Any] = field(default_factory=dict)


def _signal_name(sig: int | None) -> str:
    import signal as _signal

    if not sig:
        return ""
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _exit_words(s: Step) -> str:
    if s.signal:
        return f"killed by {_signal_name(s.signal)}"
    return f"exit code {s.exit_code}" if s.exit_code is not None else "no exit code"


def _oom_by_rss(s: Step) -> bool:
    if s.state == "OUT_OF_MEMORY":
        return True
    return (s.state == "CANCELLED" and s.max_rss is not None and s.req_mem is not None
            and s.max_rss >= OOM_FRACTION * s.req_mem)


EVENT_SLACK_S = 60.0
"""A node event this long after the job ended may still be what ended it (the DOWN is recorded late)."""


def _during(e: NodeEvent, job: Step) -> bool:
    """A node event while the job ran (its start time within the job's, give or take the slack)."""
    if e.start is None:
        return True
    return (job.start is None or e.start >= job.start - 1) and (job.end is None or e.start <= job.end + EVENT_SLACK_S)


def judge(acc: Accounting) -> AccountingJudgement:
    """The first failing step and what it means (see the module docstring)."""
    job = acc.job
    state = job.state if job else "UNKNOWN"
    steps = [s for s in acc.steps if s.step not in ("batch", "extern")]
    main = steps[0] if steps else None
    tasks = main.task_nodes() if main else {}
    if job is None:
        return AccountingJudgement(state, False, None, None, None, None,
                                   f"sacct has no record of job {acc.job_id}", tasks)
    failing = [s for s in steps if s.failed and s.state != "RUNNING"]
    oom = next((s for s in [*steps, *acc.steps] if _oom_by_rss(s)), None)
    if state == "NODE_FAIL" or any(s.state == "NODE_FAIL" for s in acc.steps):
        down = [e for e in acc.node_events if e.state.upper().startswith("DOWN") and e.node in set(job.nodes)
                and _during(e, job)]
        node = down[0].node if down else None
        ranks = sorted(r for r, n in tasks.items() if n == node) if node else []
        why = f" ({down[0].reason})" if down and down[0].reason else ""
        where = f"; {node} went DOWN{why}" if node else ""
        rank_words = f", rank {', '.join(map(str, ranks))} there" if ranks else ""
        return AccountingJudgement(state, True, "node-fail", main.id if main else None, ranks[0] if ranks else None,
                                   node, f"job {acc.job_id} ended NODE_FAIL{where}{rank_words}", tasks,
                                   {"node_events": [e.__dict__ for e in down]})
    if oom is not None:
        by = " (cancelled by Slurm's memory poll, OverMemoryKill)" if oom.state == "CANCELLED" else ""
        limit = f"limit {size_text(oom.req_mem)}, " if oom.req_mem else ""
        rank = oom.max_rss_task if oom.step not in ("batch", "extern") else None
        node = oom.max_rss_node or (oom.nodes[0] if len(oom.nodes) == 1 else None)
        where = f", task {rank} on {node}" if rank is not None and node else (f" on {node}" if node else "")
        return AccountingJudgement(state, True, "oom", oom.id, rank, node,
                                   f"step {oom.id} ended OUT_OF_MEMORY{by} ({limit}MaxRSS {size_text(oom.max_rss)}"
                                   f"{where})", tasks, {"max_rss": oom.max_rss, "limit": oom.req_mem,
                                                        "recorded_state": oom.state})
    if state == "TIMEOUT" or any(s.state == "TIMEOUT" for s in steps):
        limit = job.raw.get("Timelimit", "")
        return AccountingJudgement(state, True, "timeout", main.id if main else None, None, None,
                                   f"job {acc.job_id} ended TIMEOUT (time limit {limit})", tasks)
    if failing:
        s = failing[0]
        cause = "cancelled" if s.state == "CANCELLED" else ("signal" if s.signal else "exit")
        by = f" by uid {s.cancelled_by}" if s.cancelled_by else ""
        return AccountingJudgement(state, True, cause, s.id, None, None,
                                   f"step {s.id} ended {s.state}{by} ({_exit_words(s)})", tasks)
    if job.failed:
        by = f" by uid {job.cancelled_by}" if job.cancelled_by else ""
        return AccountingJudgement(state, True, "cancelled" if state == "CANCELLED" else "exit", None, None, None,
                                   f"job {acc.job_id} ended {state}{by} ({_exit_words(job)})", tasks)
    if state in ("RUNNING", "PENDING", "REQUEUED", "SUSPENDED"):
        return AccountingJudgement(state, False, None, None, None, None, f"job {acc.job_id} is {state}", tasks)
    return AccountingJudgement(state, False, None, None, None, None,
                               f"job {acc.job_id} ended {state} ({_exit_words(job)})", tasks)
