"""The cluster at one moment: every node's last sample, whether it still answers, and the outliers.

:func:`snapshot` turns the client's feeds into the ``result`` of the ``mldebug.top`` JSON document
(schema in ml_debug/schemas/top.json); the live view, the plain text and ``--json`` all show this
one structure.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ml_debug.core.enums import Word
from ml_debug.core.errors import ExitCode
from ml_debug.core.gcpause import gc_paused
from ml_debug.remote.targets import TargetSpec
from ml_debug.sampling.sample import NodeInfo, NodeSample
from ml_debug.top.options import TopOptions
from ml_debug.top.verdict import find_outliers

SCHEMA = "mldebug.top"
SCHEMA_VERSION = 1

class NodeStatus(Word):
    """Whether a node still answers: its last sample is fresh, it is still connecting, it has been silent
    longer than --interval + --node-timeout, or its stream ended."""

    OK = "ok"
    CONNECTING = "connecting"
    NOT_ANSWERING = "not answering"
    FAILED = "failed"


OK, CONNECTING, NOT_ANSWERING, FAILED = NodeStatus.OK, NodeStatus.CONNECTING, NodeStatus.NOT_ANSWERING, NodeStatus.FAILED


def node_status(feed: Any, now: float, grace_s: float, final: bool = False) -> tuple[NodeStatus, float | None]:
    """(status, age of the last values in seconds) of one node; ``final``: no more waiting (--once)."""
    age = None if feed.received is None else max(0.0, now - feed.received)
    if feed.ended:
        return FAILED, age
    if age is not None:
        return (OK if age <= grace_s else NOT_ANSWERING), age
    return (CONNECTING if now - feed.started <= grace_s and not final else NOT_ANSWERING), age


def node_entry(feed: Any, now: float, grace_s: float, final: bool = False) -> dict[str, Any]:
    status, age = node_status(feed, now, grace_s, final)
    s: NodeSample | None = feed.sample
    node = s.node if s is not None else NodeInfo(host="")
    error = feed.error
    if status == NOT_ANSWERING and error is None:
        error = (f"no sample for {age:.0f} s" if age is not None else
                 f"no answer within {grace_s:g} s (--interval + --node-timeout)")
    return {
        "target": feed.label,
        "host": node.host or None,
        "status": status,
        "age_s": None if age is None else round(age, 1),
        "error": error,
        "note": feed.note,
        "seq": None if s is None else s.seq,
        "sampled_at": None if s is None else s.time,
        "cpus": node.cpus,
        "cpu_pct": node.cpu_pct,
        "load1": node.load1,
        "mem_total_bytes": node.mem_total_bytes,
        "mem_used_bytes": node.mem_used_bytes,
        "agent_cpu_pct": node.agent_cpu_pct,
        "nvml": None if s is None or s.nvml is None else s.nvml.to_json(),
        "gpus": [] if s is None else [g.to_json() for g in s.gpus],
        "ranks": [] if s is None else [r.to_json() for r in s.ranks],
        # with the files a pattern names that are "not found"
        "progress": [] if s is None else [p.to_json() for p in (*s.progress, *s.progress_missing)],
        "notes": [] if s is None else list(s.notes),
    }


def exit_code(result: dict[str, Any]) -> int:
    """4 when a node did not answer, else 1 when something stands out, else 0."""
    if result["not_answering"]:
        return int(ExitCode.PARTIAL)
    return int(ExitCode.PROBLEM) if result["outliers"] else int(ExitCode.OK)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def summary(result: dict[str, Any]) -> str:
    c = result["counts"]
    parts = [f"{c['answering']}/{c['nodes']} nodes answering"]
    silent = [n for n in result["nodes"] if n["status"] != OK]
    if silent:
        parts[0] += " (" + "; ".join(f"{n['target']}: {n['status']}" + (f", {n['error']}" if n["error"] else "")
                                     for n in silent[:3]) + ("; ..." if len(silent) > 3 else "") + ")"
    text = ", ".join([*parts, _plural(c["ranks"], "rank"), _plural(c["gpus"], "GPU")])
    if result["outliers"]:
        text += f"; {_plural(len(result['outliers']), 'outlier')}: {result['outliers'][0]['message']}"
        if len(result["outliers"]) > 1:
            text += " ..."
    else:
        text += "; nothing stands out"
    return text


def snapshot(feeds: Sequence[Any], spec: TargetSpec, opts: TopOptions, *, started: float,
             now: float | None = None, final: bool = False) -> dict[str, Any]:
    """The ``mldebug.top`` result for the feeds as they are now (``final``: a node still connecting
    has had its --interval + --node-timeout and is not answering)."""
    now = time.monotonic() if now is None else now
    with gc_paused():  # 2k nodes: ~200k small objects a round (core/gcpause.py)
        nodes = [node_entry(f, now, opts.grace_s, final) for f in feeds]
        outliers = find_outliers(nodes)
    live = [n for n in nodes if n["status"] == OK]
    result: dict[str, Any] = {
        "ok": False,
        "summary": "",
        "transport": spec.kind,
        "slurm_job": spec.slurm_job,
        "interval_s": opts.interval,
        "timeout_s": opts.timeout,
        "elapsed_s": round(now - started, 2),
        "counts": {"nodes": len(nodes), "answering": len(live), "not_answering": len(nodes) - len(live),
                   "ranks": sum(len(n["ranks"]) for n in nodes), "gpus": sum(len(n["gpus"]) for n in nodes),
                   "outliers": len(outliers)},
        "nodes": nodes,
        "not_answering": [n["target"] for n in nodes if n["status"] != OK],
        "outliers": outliers,
        "exit_code": 0,
    }
    result["summary"] = summary(result)
    result["exit_code"] = exit_code(result)
    result["ok"] = result["exit_code"] == ExitCode.OK  # every node answered and nothing stands out
    return result
