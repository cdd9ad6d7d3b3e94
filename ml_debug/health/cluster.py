"""Many nodes: run ``mldebug health --local --json`` everywhere and merge the documents.

Each node judges itself; the merge adds what only a cluster view shows: nodes with another
driver version, and nodes whose GPUs are slower than the same model elsewhere.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ml_debug.core.errors import ExitCode
from ml_debug.core.output import to_jsonable
from ml_debug.health.active_checks import outlier_checks
from ml_debug.health.result import Check, HealthResult, NodeReport, Status, Unreachable

SCHEMA = "mldebug.health"


def cluster_checks(nodes: list[dict[str, Any]], outlier_pct: float) -> list[Check]:
    """Cross-node checks on the per-node JSON results."""
    out: list[Check] = []
    drivers = Counter(n["gpu"].get("driver_version") for n in nodes if n["gpu"].get("present"))
    if len(drivers) > 1:
        common = drivers.most_common(1)[0][0]
        odd = [n["target"] for n in nodes if n["gpu"].get("present") and n["gpu"].get("driver_version") != common]
        out.append(Check("cluster.driver_match", "cluster", Status.WARN,
                         ", ".join(f"{v} x{c}" for v, c in drivers.items()), "one driver version",
                         f"{', '.join(odd[:6])} run another NVIDIA driver than the rest ({common}): NCCL and CUDA "
                         "behave differently across nodes; install one version", "NVML driver version per node"))
    elif drivers:
        out.append(Check("cluster.driver_match", "cluster", Status.PASS, str(next(iter(drivers))),
                         "one driver version", "", "NVML driver version per node"))
    speeds = []
    for n in nodes:
        names = {g["index"]: g["name"] for g in n["gpu"].get("gpus", [])}
        for c in n["checks"]:
            if c["id"] == "gpu.matmul" and c["status"] != "fail" and "tflops" in c.get("data", {}):
                idx = int(c["target"][3:]) if c["target"].startswith("gpu") else None
                speeds.append((f"{n['target']}/{c['target']}", names.get(idx, "cpu"), c["data"]["tflops"]))
    by_node: dict[str, list[float]] = {}
    model: dict[str, str] = {}
    for key, name, v in speeds:
        node = key.split("/")[0]
        by_node.setdefault(node, []).append(v)
        model[node] = name
    per_node = [(node, model[node], sum(vs) / len(vs)) for node, vs in by_node.items()]
    out += [c for c in outlier_checks("cluster.node_matmul_outlier", per_node, outlier_pct, "TFLOPs")
            if c.status is not Status.PASS]
    return out


def local_result(report: NodeReport) -> HealthResult:
    """The result of ``mldebug health`` on this node alone."""
    node = to_jsonable(report)
    return HealthResult(report.ok, report.summary, report.level, report.exit_code,
                        [dict(node, target=report.host)])


def merge(agent_results: list[Any], level: int, outlier_pct: float) -> HealthResult:
    """One cluster result (the same shape as a local one, with more nodes) from AgentResults."""
    nodes: list[dict[str, Any]] = []
    unreachable: list[Unreachable] = []
    for ar in agent_results:
        doc = ar.document
        if doc and doc.get("schema") == SCHEMA and doc.get("result", {}).get("nodes"):
            for nd in doc["result"]["nodes"]:
                nodes.append(dict(nd, target=ar.node.host))
        else:
            unreachable.append(Unreachable(ar.node.host, ar.error or ar.node.detail or "no result"))
    extra = cluster_checks(nodes, outlier_pct)
    failed_nodes = [n for n in nodes if not n["ok"] and n["exit_code"] == ExitCode.PROBLEM]
    cluster_fail = any(c.status is Status.FAIL for c in extra)
    if failed_nodes or cluster_fail:
        code = ExitCode.PROBLEM
    elif unreachable:
        code = ExitCode.PARTIAL
    elif any(n["exit_code"] == ExitCode.ENVIRONMENT for n in nodes):
        code = ExitCode.ENVIRONMENT
    else:
        code = ExitCode.OK
    parts = [f"{len(nodes)} node(s) answered"]
    if failed_nodes:
        parts.append(f"{len(failed_nodes)} failing ({', '.join(n['target'] for n in failed_nodes[:6])})")
    if cluster_fail:
        parts.append("; ".join(c.hint for c in extra if c.status is Status.FAIL)[:200])
    if unreachable:
        parts.append(f"{len(unreachable)} not reached ({', '.join(u.host for u in unreachable[:6])})")
    env = [n["target"] for n in nodes if n["exit_code"] == ExitCode.ENVIRONMENT]
    if env:
        parts.append(f"{len(env)} without the expected GPU ({', '.join(env[:6])})")
    ok = code == ExitCode.OK
    summary = ("healthy: " if ok else "") + "; ".join(parts)
    return HealthResult(ok, summary, level, int(code), nodes, unreachable, extra)
