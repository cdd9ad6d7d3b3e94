"""The report and the views of `mldebug exec`: prefixed lines, dshbak-style groups, a summary."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from ml_debug.core.errors import ExitCode
from ml_debug.remote.hostlist import compress_hostlist
from ml_debug.remote.result import INTERRUPTED, NOT_REACHED, NodeResult
from ml_debug.remote.targets import TargetSpec

REASONS = ("command failed", "unreachable", "auth failed", "host key mismatch", "timed out", "interrupted")


@dataclass
class ExecReport:
    """What `mldebug exec --json` puts under "result"."""

    ok: bool
    summary: str
    command: list[str]
    transport: str
    slurm_job: str | None
    targets: int
    counts: dict[str, int]
    nodes: list[NodeResult] = field(default_factory=list)


def _hostlist(names: Sequence[str], limit: int = 6) -> str:
    # host:port labels do not compress; plain names do (node[01-16]).
    if all(":" not in n for n in names):
        return compress_hostlist(names)
    return ",".join(names[:limit]) + (f",... ({len(names)} in all)" if len(names) > limit else "")


def build_report(spec: TargetSpec, command: Sequence[str], results: Sequence[NodeResult]) -> ExecReport:
    counts = {"ok": sum(r.ok for r in results)}
    for reason in REASONS:
        counts[reason.replace(" ", "_")] = sum(r.failure == reason for r in results)
    parts = [f"{counts['ok']}/{len(results)} nodes ok"]
    for reason in REASONS:
        bad = [r for r in results if r.failure == reason]
        if bad:
            example = bad[0].detail or reason
            parts.append(f"{len(bad)} {reason}: {_hostlist([r.host for r in bad])} ({example})")
    return ExecReport(ok=all(r.ok for r in results), summary="; ".join(parts), command=list(command),
                      transport=spec.kind, slurm_job=spec.slurm_job, targets=len(spec.targets),
                      counts=counts, nodes=list(results))


def exit_code(results: Sequence[NodeResult]) -> int:
    """130 after Ctrl-C, else 4 when some node never answered, else 1 when a command failed, else 0."""
    if any(r.failure == INTERRUPTED for r in results):
        return ExitCode.INTERRUPTED
    if any(r.failure in NOT_REACHED for r in results):
        return ExitCode.PARTIAL
    return ExitCode.PROBLEM if any(r.failure for r in results) else ExitCode.OK


def print_prefixed(r: NodeResult) -> None:
    """``[host] line`` for each line as a node finishes: stdout to stdout, stderr to stderr."""
    for text, stream in ((r.stdout, sys.stdout), (r.stderr, sys.stderr)):
        if text:
            stream.write("".join(f"[{r.host}] {line}\n" for line in text.splitlines()))
            stream.flush()
    if r.failure in NOT_REACHED:
        sys.stderr.write(f"[{r.host}] mldebug: {r.failure}: {r.detail}\n")
        sys.stderr.flush()


def print_grouped(results: Sequence[NodeResult]) -> None:
    """Nodes with identical output under one header (``dshbak -c``), biggest group first."""
    groups: dict[str, list[str]] = {}
    for r in results:
        if r.failure in NOT_REACHED:
            continue
        groups.setdefault(r.stdout + r.stderr, []).append(r.host)
    out = sys.stdout
    for text, hosts in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        title = f"{_hostlist(hosts)} ({len(hosts)})"
        rule = "-" * min(max(len(title), 16), 100)
        out.write(f"{rule}\n{title}\n{rule}\n{text if text.endswith(chr(10)) or not text else text + chr(10)}")
    out.flush()


def print_summary(report: ExecReport) -> None:
    """One line per failure reason on stderr (the data on stdout stays clean for pipes)."""
    from ml_debug.core.output import log

    nodes = report.nodes
    if report.ok:
        log(f"mldebug exec: {report.summary}")
        return
    log(f"mldebug exec: {report.summary.split(';')[0]}")
    for reason in REASONS:
        bad = [r for r in nodes if r.failure == reason]
        for r in bad:
            log(f"  {r.host}: {reason}: {r.detail}")
