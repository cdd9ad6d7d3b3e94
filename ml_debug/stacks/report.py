"""The dump-stacks report: every process with its raw samples, the groups, the suspects and the verdict.

Local and multi-node runs build the same structure: a remote node's `dump-stacks --local --json`
result is merged by concatenating its `nodes` and `processes` and analysing the union again.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ml_debug.core.errors import ExitCode
from ml_debug.core.output import to_jsonable
from ml_debug.stacks.collect import NodeResult
from ml_debug.stacks.merge import Analysis, Member, analyse, member_state
from ml_debug.stacks.model import dump_from_json

SCHEMA = "mldebug.dump-stacks"
SCHEMA_VERSION = 1


def node_processes(node: NodeResult) -> list[dict[str, Any]]:
    out = []
    for t in node.targets:
        d = asdict(t)
        d["samples"] = to_jsonable(node.samples.get(t.pid, []))
        out.append(d)
    return out


def node_summary(node: NodeResult) -> dict[str, Any]:
    dumped = sum(1 for t in node.targets if any(s.ok for s in node.samples.get(t.pid, [])))
    return {"host": node.host, "ok": node.ok and dumped == len(node.targets), "error": node.error,
            "targets": len(node.targets), "dumped": dumped, "launchers": node.launchers, "skipped": node.skipped,
            "notes": node.notes, "ptrace": node.ptrace, "seconds": node.seconds}


def failed_node(host: str, error: str) -> dict[str, Any]:
    """A node that never answered (ssh refused, srun timed out, mldebug missing there)."""
    return {"host": host, "ok": False, "error": error, "targets": 0, "dumped": 0, "launchers": [],
            "skipped": [], "notes": [], "ptrace": {}, "seconds": 0.0}


def _members(processes: list[dict[str, Any]]) -> list[Member]:
    return [Member(host=p["host"], pid=int(p["pid"]), rank=p.get("rank"), local_rank=p.get("local_rank"),
                   world_size=p.get("world_size"), samples=[dump_from_json(s) for s in p.get("samples", [])])
            for p in processes]


def _frame_json(f: Any) -> dict[str, Any] | None:
    return None if f is None else {"name": f.name, "file": f.short, "line": f.line, "where": f.where()}


def build_report(nodes: list[dict[str, Any]], processes: list[dict[str, Any]], options: dict[str, Any],
                 expected_world: int | None = None) -> dict[str, Any]:
    """Analyse all processes of all nodes and return the JSON `result` (human view draws from it)."""
    members = _members(processes)
    analysis: Analysis = analyse(members, expected_world)
    by_id = {m.id: m for m in members}
    group_of = {m.id: g.id for g in analysis.groups for m in g.members}
    for p in processes:
        mid = f"{p['host']}:{p['pid']}"
        m = by_id[mid]
        p["group"] = group_of.get(mid)
        p["state"] = member_state(m) if m.last_ok() is not None else "not-dumped"
        p["error"] = None if m.last_ok() is not None else m.error()
        fixes = [s.get("fix") for s in p.get("samples", []) if s.get("fix")]
        p["fix"] = None if m.last_ok() is not None else (fixes[-1] if fixes else None)
    groups = [{
        "id": g.id, "size": g.size, "state": g.state,
        "ranks": [m.rank for m in g.members],
        "members": [m.id for m in g.members],
        "hosts": sorted({m.host for m in g.members}),
        "collective": _frame_json(g.collective), "location": _frame_json(g.location),
        "frames": [_frame_json(f) for f in g.frames],
    } for g in analysis.groups]
    failed_nodes = [n for n in nodes if n.get("error")]
    partial = bool(analysis.not_dumped or failed_nodes)
    dumped_any = any(g for g in analysis.groups)
    if not dumped_any:
        code = ExitCode.PARTIAL if failed_nodes else ExitCode.ENVIRONMENT
    elif partial:
        code = ExitCode.PARTIAL
    elif analysis.suspects:
        code = ExitCode.PROBLEM
    else:
        code = ExitCode.OK
    summary = analysis.verdict
    if failed_nodes:
        summary += f"; {len(failed_nodes)} node(s) not reached: " + ", ".join(
            f"{n['host']} ({n['error']})" for n in failed_nodes[:3])
    return {
        "ok": code == ExitCode.OK,
        "summary": summary,
        "verdict": analysis.verdict,
        "exit_code": int(code),
        "options": options,
        "nodes": nodes,
        "processes": processes,
        "groups": groups,
        "tree": analysis.tree,
        "suspects": to_jsonable(analysis.suspects),
        "missing_ranks": analysis.missing_ranks,
        "not_dumped": [{"host": m.host, "pid": m.pid, "rank": m.rank, "error": m.error(),
                        "fix": by_fix(processes, m.id)} for m in analysis.not_dumped],
    }


def by_fix(processes: list[dict[str, Any]], mid: str) -> str | None:
    for p in processes:
        if f"{p['host']}:{p['pid']}" == mid:
            return p.get("fix")
    return None
