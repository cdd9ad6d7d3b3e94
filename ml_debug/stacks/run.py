"""dump-stacks from options to result: on this node, or on many through the remote layer.

Each remote node runs ``mldebug dump-stacks --local --json`` with the same selectors; the
per-node documents are read back, concatenated (processes and nodes) and analysed as one job.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ml_debug.core import output
from ml_debug.core.errors import ExitCode
from ml_debug.remote.targets import TargetSpec
from ml_debug.stacks.fr_analysis import EntryPool
from ml_debug.stacks.request import DumpRequest
from ml_debug.stacks.verdict import (
    SCHEMA,
    SCHEMA_VERSION,
    DumpStacksResult,
    NodeSummary,
    ProcessSamples,
    build_report,
    failed_node,
    node_processes,
    node_summary,
    read_node_document,
    with_node_note,
)


def _options(req: DumpRequest) -> dict[str, Any]:
    """The request as the result records it."""
    d = asdict(req)
    for key in ("pids", "all_threads", "full", "out_dir"):
        d.pop(key)
    d["env"] = req.env_filter
    return d


def local_report(req: DumpRequest, stop: threading.Event | None = None) -> DumpStacksResult:
    """Find and dump the targets on this node; the result for this node alone (`stop`: see
    :func:`ml_debug.stacks.collect.dump_processes`)."""
    from ml_debug.procs import find_processes
    from ml_debug.stacks.collect import NodeDump, dump_processes
    from ml_debug.stacks.dumpers import DumpOptions, resolve_tools

    tools = resolve_tools(req.dumper)  # exit 3 with the install hint before doing anything
    found = find_processes(pids=req.pids or None, pattern=req.pattern, user=req.user, gpu=req.gpu,
                         include_launcher=req.include_launcher, env=req.env_filter or None)
    if not found.processes:
        node = NodeDump(host=found.host, ok=True, launchers=[asdict(x) for x in found.launchers],
                          skipped=found.skipped, notes=[*found.notes, "no target processes found"])
        return build_report([node_summary(node)], [], _options(req), req.world_size, local=True)
    opts = DumpOptions(timeout=req.timeout, gdb_timeout=req.gdb_timeout, native=req.native, locals=req.locals,
                       dumper=req.dumper)
    node = dump_processes(found, tools, opts, samples=req.samples, interval=req.interval, stop=stop, kernel=req.kernel,
                        strace_s=req.strace)
    fr_records: list[dict[str, Any]] = []
    if req.flight_recorder and not node.interrupted:
        from ml_debug.stacks.flight import gather

        fr_records = gather(found.processes, found.host, req.fr_timeout)
    result = build_report([node_summary(node)], node_processes(node), _options(req), req.world_size,
                          fr_records=fr_records, local=True)
    if node.interrupted:  # what was taken is the result (and goes to --out-dir); the exit code says Ctrl-C
        result = dataclasses.replace(result, ok=False, exit_code=ExitCode.INTERRUPTED, interrupted=True,
                                     summary=f"{result.summary} (interrupted after {node.rounds} of {req.samples} "
                                             "samples)")
    return result


def dump_stacks_result(spec: TargetSpec, req: DumpRequest, out_dir: Path | None = None,
                       stop: threading.Event | None = None) -> DumpStacksResult:
    """The merged result for the targets of `spec` (this node, --hosts, or --slurm-job).

    `stop`, set from another thread, ends the samples early and keeps those taken (on this node;
    a run over --hosts or --slurm-job stops on Ctrl-C only)."""
    from ml_debug.core import safefs

    if out_dir is not None:  # an unusable --out-dir is said before the work, not after it
        safefs.make_out_dir(out_dir)
    if spec.kind == "local":
        result = local_report(req, stop)
        if out_dir is not None:
            name = f"{socket.gethostname()}.json"
            note = safefs.planted(out_dir, name)
            if note:
                result = with_node_note(result, f"--out-dir: {note}")
            safefs.write_out(out_dir, name, output.dumps(output.document(SCHEMA, SCHEMA_VERSION, result)) + "\n")
        return result

    from ml_debug.remote.result import Interrupted
    from ml_debug.remote.runner import AgentResult, on_every_node

    if spec.kind == "slurm" and spec.slurm_job and "SLURM_JOB_ID" not in req.env_filter:
        # srun --overlap lands beside the job's tasks: keep only that job's processes on each node
        req = dataclasses.replace(req, env=[*req.env, ("SLURM_JOB_ID", spec.slurm_job)])

    def arrived(r: AgentResult) -> None:
        output.log(f"dump-stacks: {r.node.host}: " + (r.error or f"answered in {r.node.duration_s:.1f} s"))

    budget = req.node_budget()
    interrupted = False
    try:
        results = on_every_node("dump-stacks", req, spec, timeout_s=budget, out_dir=out_dir, on_result=arrived)
    except Interrupted as e:  # Ctrl-C: each node's agent stopped and printed the samples it had taken
        results, interrupted = e.results, True
    reached = {r.node.host for r in results}
    nodes: list[NodeSummary] = []
    processes: list[ProcessSamples] = []
    fr_records: list[dict[str, Any]] = []
    pool = EntryPool()  # equal Flight Recorder entries of all nodes kept once: compared by identity
    for r in results:
        doc = r.document
        body = doc.get("result") if isinstance(doc, dict) else None
        if not isinstance(body, dict) or "processes" not in body:
            nodes.append(failed_node(r.node.host, r.error or "no dump-stacks result in its output"))
            continue
        try:  # e.g. another mldebug version: its data is used, the difference said in its notes
            part = read_node_document(body, r.node.host, r.error, pool=pool)
        except (KeyError, TypeError, ValueError) as e:
            nodes.append(failed_node(r.node.host, f"its dump-stacks result could not be read ({type(e).__name__}: {e})"))
            continue
        nodes.extend(part.nodes)
        processes.extend(part.processes)
        fr_records.extend(part.fr_records)
    for t in spec.targets:
        if t.label not in reached:
            nodes.append(failed_node(t.label, "no result (interrupted or not started)"))
    result = build_report(nodes, processes, _options(req), req.world_size, fr_records=fr_records)
    if interrupted:
        result = dataclasses.replace(result, ok=False, exit_code=ExitCode.INTERRUPTED, interrupted=True,
                                     summary=f"{result.summary} (interrupted: the samples each node took before "
                                             "Ctrl-C)")
    if out_dir is not None:
        note = safefs.planted(out_dir, "merged.json")
        if note:
            output.warn(f"--out-dir: {note}")
        safefs.write_out(out_dir, "merged.json",
                         json.dumps(output.document(SCHEMA, SCHEMA_VERSION, result), indent=2) + "\n")
    return result


def dump_stacks_report(spec: TargetSpec, req: DumpRequest, out_dir: Path | None = None) -> dict[str, Any]:
    """:func:`dump_stacks_result` as JSON data: what ``--json`` prints under ``result``."""
    return dict(output.to_jsonable(dump_stacks_result(spec, req, out_dir)))
