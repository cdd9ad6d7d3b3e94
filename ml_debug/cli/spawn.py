"""The one way a command starts its own ranks.

It hands the command's configuration over as command-line words (:func:`ml_debug.core.options.to_argv`):
a rank runs ``mldebug <command> <words>`` and rebuilds the same configuration from them. Other nodes
are reached the same way, by :func:`ml_debug.remote.runner.on_every_node`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ml_debug.core import output
from ml_debug.core.errors import ExitCode
from ml_debug.core.options import to_argv
from ml_debug.dist.options import SpawnOptions

if TYPE_CHECKING:
    from ml_debug.dist.spawn import SpawnResult


def forward_argv(command: str, *configs: Any, extra: Sequence[str] = ()) -> list[str]:
    """``<command> <options of configs> <extra>`` (and ``--json`` when this run prints JSON)."""
    argv = [command]
    for config in configs:
        argv += to_argv(config)
    argv += list(extra)
    if output.MODE.json:
        argv.append("--json")
    return argv


def default_nproc(backend: str, device: str) -> tuple[int, int]:
    """(ranks to start, GPUs they use): one per visible GPU, or 2 CPU ranks."""
    gpus = 0
    if device.lower() != "cpu" and backend.lower() != "gloo":
        from ml_debug.dist.device import visible_gpus

        gpus = visible_gpus()
    return (gpus or 2), gpus


def spawn_ranks(command: str, configs: Sequence[Any], launch: SpawnOptions, *, gpus: int,
                rdzv_timeout_s: float = 30.0, run_timeout_s: float | None = None,
                linger_s: float = 30.0, extra: Sequence[str] = (), wrapper: Sequence[str] = ()) -> int:
    """Run ``mldebug <command>`` as ``--nproc-per-node`` ranks of a (multi-node) world; the exit code.

    Rank 0 prints the verdict. A rank killed or stopped is named on stderr, and the run is partial.
    """
    from ml_debug.core import lifecycle
    from ml_debug.dist.spawn import SpawnInterrupted, SpawnSpec
    from ml_debug.dist.spawn import spawn as run_ranks

    nproc = ranks_to_start(launch, gpus)
    spec = SpawnSpec(nproc, nnodes=launch.nnodes, node_rank=launch.node_rank, master_addr=launch.master_addr,
                      master_port=launch.master_port, rdzv_timeout_s=rdzv_timeout_s, run_timeout_s=run_timeout_s,
                      linger_s=linger_s, cpu_ranks=not gpus, wrapper=tuple(wrapper))
    try:
        result = run_ranks(forward_argv(command, *configs, extra=extra), spec)
    except SpawnInterrupted as e:
        sig = lifecycle.interrupting_signal()
        _one_document(command, e.result, ExitCode.INTERRUPTED,
                      "interrupted" if sig == "SIGINT" else f"interrupted by {sig}", signal=sig)
        raise
    said: list[str] = []

    def warn(message: str) -> None:
        said.append(message)
        output.warn(message)

    if result.stopped:
        ranks = ", ".join(map(str, result.stopped))
        warn(f"rank{'s' if len(result.stopped) > 1 else ''} {ranks} still running {linger_s:g} s after "
             "another rank finished: stopped (hung?)")
    if result.timed_out and run_timeout_s:
        warn(f"{command} ranks did not finish within {run_timeout_s:g} s; they were stopped")
    code = result.code
    if code == ExitCode.PARTIAL:
        killed = sorted(r for r, c in result.exit_codes.items() if c < 0 and r not in result.stopped)
        if killed:
            warn(f"some ranks did not finish (killed or crashed: {killed})")
    elif code == ExitCode.OK and any(c != 0 for c in result.exit_codes.values()):
        bad = {r: c for r, c in result.exit_codes.items() if c != 0}
        warn(f"rank 0 finished but other ranks failed: {bad}")
        code = ExitCode.PROBLEM
    _one_document(command, result, int(code), "; ".join(said) or f"{command} ranks ended with exit code {code}")
    return int(code)


def _one_document(command: str, result: SpawnResult, code: int, message: str, **kw: Any) -> None:
    """With --json, print the run's one document: the reporting rank's own when its verdict is the run's,
    else an error document that says why, with that rank's document (if any) as the partial result."""
    import json

    if not output.MODE.json or output.MODE.documents:
        return
    docs: dict[int, dict[str, Any]] = {}
    for rank, text in sorted(result.documents.items()):
        try:
            doc = json.loads(text)
        except ValueError:
            continue
        if isinstance(doc, dict):
            docs[rank] = doc
    reporter = min(docs, default=-1)
    doc = docs.get(reporter)
    if doc is not None and doc.get("schema") != output.ERROR_SCHEMA and result.exit_codes.get(reporter) == code \
            and not kw:
        output.write_document(doc)
        return
    if code == ExitCode.OK:  # another node's rank 0 reports; this node's ranks all succeeded
        return
    errors = {r: d.get("result", {}).get("summary") for r, d in docs.items() if d.get("schema") == output.ERROR_SCHEMA}
    if doc is not None and doc.get("schema") == output.ERROR_SCHEMA and not kw and code == result.exit_codes.get(reporter):
        output.write_document(doc)  # the reporting rank's own error (a bad option, a failed collective)
        return
    partial = doc if doc is not None and doc.get("schema") != output.ERROR_SCHEMA else None
    output.emit_error(command, code, message, None, partial=partial,
                      details={"rank_exit_codes": result.exit_codes, "stopped_ranks": result.stopped,
                               "timed_out": result.timed_out, "rank_errors": errors}, **kw)


def ranks_to_start(launch: SpawnOptions, gpus: int) -> int:
    """How many local ranks to start: --nproc-per-node, or one per GPU (2 CPU ranks without one), refused
    (exit 2, before anything starts) above what this node can run (see :func:`ml_debug.dist.limits.check_nproc`)."""
    from ml_debug.dist.limits import check_nproc

    nproc = launch.nproc_per_node or (gpus or 2)
    check_nproc(nproc, launch.max_nproc_per_node)
    return nproc
