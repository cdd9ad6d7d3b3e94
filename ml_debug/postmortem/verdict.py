"""One verdict from every source a failed job left: the logs' report, Slurm accounting, the nodes' kernel
logs and the Flight Recorder dumps. It names the first failing rank and its node with what each source
says about it, and says where the sources disagree.

Which source names the rank, strongest first: a failure line in the logs (a traceback, a CUDA error) on a
known rank; accounting's out-of-memory or node failure (its task and node); a kernel event on one of the
job's nodes (Xid, the OOM killer, a segfault); the Flight Recorder's odd rank (a desync, a collective
never issued); then a failure the logs hold without a rank, or a failed step. A source that names no
rank still gives its node, and a node gives its ranks through the step's layout. The kernel says where,
never whether: a node's log holds every process's events, so it alone never makes a job failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ml_debug.postmortem.accounting import AccountingJudgement
from ml_debug.postmortem.frdumps import FrSource
from ml_debug.postmortem.kernel import KernelEvent, NodeKernelLog

KERNEL_CAUSES = ("xid", "oom-kill", "segfault")
TRACEBACK_KINDS = ("traceback", "exception", "error-file", "cuda-error")
"""The logs' event kinds that are the rank's own account of its failure (``ml_debug.logs.result.Event.kind``)."""


@dataclass
class Finding:
    """What one source says about the failure."""

    source: str
    """logs, accounting, kernel or flight-recorder."""
    sentence: str
    rank: int | None = None
    node: str | None = None
    cause: str | None = None

    def where(self) -> str:
        if self.rank is not None:
            return f"rank {self.rank}" + (f" ({self.node})" if self.node else "")
        return self.node or "no rank named"


@dataclass
class PostmortemVerdict:
    """The answer from every source."""

    failed: bool
    rank: int | None
    node: str | None
    cause: str | None
    named_by: str | None
    """The source whose finding names the rank (logs, accounting, kernel, flight-recorder)."""
    summary: str
    findings: list[Finding] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)


def logs_finding(report: Any) -> Finding | None:
    """The logs' own verdict (``ml_debug.logs``' public report) as a finding."""
    if report is None:
        return None
    v = report.verdict
    p = v.primary
    if p is None:
        return Finding("logs", v.summary) if v.failed else None
    return Finding("logs", p.message, p.who.rank, p.who.node, p.kind)


def kernel_findings(logs: list[NodeKernelLog], job_nodes: set[str], pid_ranks: dict[tuple[str, int], int]
                    ) -> list[Finding]:
    """The kernel events that can end a rank, on the job's nodes, with the rank where a pid names it."""
    out = []
    for log in logs:
        if job_nodes and log.node not in job_nodes:
            continue
        for ev in log.events:
            if ev.kind not in KERNEL_CAUSES and ev.kind != "hung-task":
                continue
            rank = pid_ranks.get((log.node, ev.pid)) if ev.pid is not None else None
            out.append(Finding("kernel", f"{log.node}: {ev.describe()}", rank, log.node, ev.kind))
    return out


def fr_findings(fr: FrSource | None, task_nodes: dict[int, str]) -> list[Finding]:
    if fr is None or fr.section is None:
        return []
    culprits = fr.culprits
    said = fr.findings
    out = []
    for c in culprits:
        rank = c.get("rank")
        node = c.get("host") or (task_nodes.get(rank) if rank is not None else None)
        sentence = next((s for s in said if f"rank {rank} " in s or s.startswith("desync")), said[0] if said else
                        fr.section.get("evidence", ""))
        out.append(Finding("flight-recorder", sentence, rank, node, c.get("why")))
    if not out and fr.section.get("behind"):
        b = fr.section["behind"][0]
        out.append(Finding("flight-recorder", fr.section["evidence"], b.get("rank"),
                           b.get("host") or task_nodes.get(b.get("rank")), "behind"))
    return out


def _fill(f: Finding, task_nodes: dict[int, str]) -> Finding:
    node = f.node or (task_nodes.get(f.rank) if f.rank is not None else None)
    rank = f.rank
    if rank is None and node is not None:
        there = [r for r, n in task_nodes.items() if n == node]
        rank = there[0] if len(there) == 1 else None
    return Finding(f.source, f.sentence, rank, node, f.cause)


def decide(report: Any, acc: AccountingJudgement | None, kernel: list[NodeKernelLog], fr: FrSource | None,
           job_nodes: list[str], pid_ranks: dict[tuple[str, int], int] | None = None) -> PostmortemVerdict:
    """The first failing rank, from every source (see the module docstring)."""
    tasks = dict(acc.task_nodes) if acc else {}
    lf = logs_finding(report)
    af = Finding("accounting", acc.sentence, acc.rank, acc.node, acc.cause) if acc and acc.failed else None
    kf = kernel_findings(kernel, set(job_nodes), pid_ranks or {})
    ff = fr_findings(fr, tasks)
    node_accounting = af if af and af.cause in ("oom", "node-fail") else None
    # the logs name the rank first, unless accounting knows an out of memory or a lost node and all the logs
    # hold is a line about it (Slurm's "exceeded memory limit", a kill): a traceback of the rank's own still wins
    strong_logs = lf if lf and lf.rank is not None and lf.cause is not None and (
        node_accounting is None or lf.cause in TRACEBACK_KINDS) else None
    order: list[Finding | None] = [strong_logs, node_accounting,
                                   *[k for k in kf if k.cause in KERNEL_CAUSES], *ff, lf, af, *kf]
    chosen = next((_fill(f, tasks) for f in order if f is not None and (f.rank is not None or f.node is not None)),
                  None) or next((f for f in order if f is not None), None)
    findings = [f for f in [lf, af, *kf, *ff] if f is not None]
    # the kernel says where, not whether: a node's log holds every process's events (a shared node's too)
    failed = bool(chosen) and any(f.source != "kernel" for f in findings)
    if chosen is None or not failed:
        state = f"; accounting: {acc.sentence}" if acc else ""
        return PostmortemVerdict(False, None, None, None, None, "no failure found" + state, findings,
                                 _disagreements(None, lf, af, kf, ff, acc))
    if chosen.source == "logs":
        parts = [f"{chosen.where()}: {chosen.sentence}"]
    else:
        quiet = report is not None and (lf is None or lf.rank != chosen.rank or lf.cause not in TRACEBACK_KINDS)
        parts = [f"{chosen.where()}: " + ("no traceback; " if quiet else "") + f"{chosen.source}: {chosen.sentence}"]
    for f in findings:
        if f is chosen or (f.source == chosen.source and f.sentence == chosen.sentence):
            continue
        if f.source == "kernel" and f.node != chosen.node:
            continue
        if f.source == "logs" and chosen.source != "logs" and (f.rank is None or f.rank != chosen.rank):
            continue
        if f.source == "flight-recorder" and f.rank is not None and f.rank != chosen.rank:
            continue
        parts.append(f"{f.source}: {f.sentence}")
    summary = "; ".join(dict.fromkeys(parts))
    return PostmortemVerdict(True, chosen.rank, chosen.node, chosen.cause, chosen.source, summary, findings,
                             _disagreements(chosen, lf, af, kf, ff, acc))


def _disagreements(chosen: Finding | None, lf: Finding | None, af: Finding | None, kf: list[Finding],
                   ff: list[Finding], acc: AccountingJudgement | None) -> list[str]:
    out = []
    if lf and lf.rank is not None:
        odd = [f for f in ff if f.rank is not None and f.rank != lf.rank]
        if odd:
            out.append(f"the logs name rank {lf.rank} first, the Flight Recorder rank {odd[0].rank} "
                       f"({odd[0].cause}): the rank that failed first may not be the rank that went astray")
    if af and af.node and lf and lf.node and af.node != lf.node:
        out.append(f"accounting points at {af.node} ({af.cause}), the logs' first failure is on {lf.node}")
    if chosen and chosen.node:
        for k in kf:
            if k.cause in KERNEL_CAUSES and k.node != chosen.node:
                out.append(f"the kernel of {k.node} reports {k.cause} ({k.sentence}), the verdict names {chosen.node}")
    if acc is not None and lf is not None and not acc.failed and acc.state == "COMPLETED":
        out.append(f"accounting says the job COMPLETED, the logs show a failure ({lf.sentence})")
    if acc is not None and acc.failed and lf is None:
        out.append(f"the logs show no failure, accounting does: {acc.sentence}")
    return list(dict.fromkeys(out))


def kernel_event_json(ev: KernelEvent) -> dict[str, Any]:
    return {"kind": ev.kind, "node": ev.node, "time": ev.time, "pid": ev.pid, "comm": ev.comm,
            "message": ev.message, "what": ev.describe(), "detail": ev.detail}
