"""The health hook Slurm calls: level 1 checks of this node, then drain, resume or leave it.

Rules (docs/slurm-health.md):

- a failing node that is not drained is drained with a reason that starts ``mldebug:`` and names the
  first failing check and its GPU (``mldebug: gpu3 row_remap 2 pending``);
- a healthy node is resumed only when it is drained and its reason starts with ``mldebug:``: a node an
  administrator drained (any other reason) is never resumed, and never re-labelled;
- ``--dry-run`` decides the same way and changes nothing.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
from dataclasses import dataclass, field

from ml_debug.core.errors import ExitCode, MLDebugError
from ml_debug.health.options import HealthOptions
from ml_debug.health.result import Check, NodeReport, Status
from ml_debug.slurmhook import scontrol
from ml_debug.slurmhook.options import SlurmCheckOptions

PREFIX = "mldebug:"
MAX_REASON = 200  # Slurm keeps more, but `sinfo -R` shows the start


@dataclass
class HookResult:
    """The ``result`` of ``mldebug health --slurm-check --json``."""
    ok: bool
    summary: str            # the one line the hook prints
    node: str
    action: str             # none, drain, resume, keep (already drained by mldebug), left (not ours)
    dry_run: bool
    reason: str | None      # the drain reason mldebug uses (or would use)
    state_before: str | None
    reason_before: str | None
    failed: list[Check]
    gpus: int               # GPUs NVML answered for
    nvml: str               # where NVML came from ("nvml", or "fake:<scenario>" in tests)
    exit_code: int
    duration_s: float
    history: str | None = None   # the database written, or why not
    notes: list[str] = field(default_factory=list)


def node_name(given: str | None) -> str:
    name = given or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    return scontrol.check_node_name(name)


def reason_for(failed: list[Check]) -> str:
    """``mldebug: gpu3 row_remap 2 pending (+1 more)``: one line, printable, bounded."""
    first = failed[0]
    text = f"{PREFIX} {first.label} {first.value}".strip()
    more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    text = " ".join(text.split())
    if len(text) + len(more) > MAX_REASON:
        text = text[:MAX_REASON - len(more) - 3] + "..."
    return text + more


def is_ours(reason: str | None) -> bool:
    return bool(reason) and str(reason).startswith(PREFIX)


def decide(failed: list[Check], state: scontrol.NodeState | None) -> str:
    """none, drain, keep (drained by mldebug, still failing), resume, left (drained by someone else)."""
    if state is None:  # --dry-run without scontrol: what a node in service would get
        return "drain" if failed else "none"
    if failed:
        if not state.drained:
            return "drain"
        return "keep" if is_ours(state.reason) else "left"
    if state.drained:
        return "resume" if is_ours(state.reason) else "left"
    return "none"


def run_hook(health: HealthOptions, opts: SlurmCheckOptions) -> HookResult:
    """Check this node, act on Slurm, record it; raises only for bad input or a missing scontrol."""
    from ml_debug.health.run import run_local

    t0 = time.perf_counter()
    node = node_name(opts.node)
    state: scontrol.NodeState | None = None
    notes: list[str] = []
    if opts.dry_run:
        try:
            state = scontrol.show_node(node)
        except MLDebugError as e:
            if e.exit_code == ExitCode.USAGE:
                raise
            notes.append(f"node state not read ({e.message}): decided as for a node in service")
    else:
        state = scontrol.show_node(node)  # no scontrol, unknown node: said before the checks
    report: NodeReport = run_local(health)
    failed = [c for c in report.checks if c.status is Status.FAIL]
    if not failed and report.exit_code == int(ExitCode.ENVIRONMENT):  # a GPU expected, none found
        failed = [Check("gpu.count", "node", Status.FAIL, "0 GPUs", "", report.summary, "NVML")]
    action = decide(failed, state)
    reason = reason_for(failed) if failed else None
    summary = _line(node, action, opts.dry_run, reason, state, report)
    code = int(ExitCode.PROBLEM) if failed and not opts.exit_zero else int(ExitCode.OK)
    result = HookResult(not failed, summary, node, action, opts.dry_run, reason,
                        state.state if state else None, state.reason if state else None, failed,
                        len(report.gpu.gpus), report.gpu.nvml_source, code,
                        round(time.perf_counter() - t0, 3), notes=notes)
    try:
        if action == "keep" and state is not None and state.reason != reason and not opts.dry_run:
            scontrol.drain(node, reason or PREFIX)  # still ours: say what fails now
        elif action == "drain" and not opts.dry_run:
            scontrol.drain(node, reason or PREFIX)
        elif action == "resume" and not opts.dry_run:
            scontrol.resume(node)
    except MLDebugError:
        if opts.record:  # the checks are kept even when Slurm refused the change
            result.action = "none"
            _record(opts, result, report)
        raise
    if opts.record:
        result.history = _record(opts, result, report)
    return result


def _line(node: str, action: str, dry: bool, reason: str | None, state: scontrol.NodeState | None,
          report: NodeReport) -> str:
    would = "would " if dry else ""
    if action == "drain":
        return f"{node}: {reason} -> {would}drain"
    if action == "keep":
        return f"{node}: {reason} -> stays drained (drained by mldebug)"
    if action == "resume":
        return f"{node}: healthy -> {would}resume (was drained: {state.reason if state else ''})"
    if action == "left":
        what = reason or "healthy"
        return f"{node}: {what} -> left drained: {state.reason if state else ''!s} is not mldebug's drain"
    return f"{node}: healthy ({report.counts['pass']} checks pass)"


def _source() -> str:
    """slurm-check, or slurm-check:epilog_slurmd / :prolog_slurmd (Slurm names the script's context)."""
    context = "".join(ch for ch in os.environ.get("SLURM_SCRIPT_CONTEXT", "") if ch.isalnum() or ch == "_")[:40]
    return f"slurm-check:{context}" if context else "slurm-check"


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.geteuid()}"


def _record(opts: SlurmCheckOptions, result: HookResult, report: NodeReport) -> str:
    import sqlite3

    from ml_debug.history.store import CheckRow, open_history

    rows = [CheckRow(c.id, c.target, c.status.value, c.value, c.hint) for c in report.checks]
    try:
        with open_history(opts.history) as h:
            h.record_run(result.node, _source(), result.ok, result.reason or report.summary, rows,
                         report.duration_s)
            if result.action in ("drain", "resume") or (result.action == "left" and not result.ok):
                action = ("would-" if result.dry_run else "") + result.action
                h.record_action(result.node, action, result.reason or result.reason_before or "",
                                f"{_user()}@{socket.gethostname()}")
            return str(h.path)
    except MLDebugError as e:
        return f"not recorded: {e.message}"
    except sqlite3.Error as e:
        return f"not recorded: {e}"
