"""The one way a command starts its own ranks.

It hands the command's configuration over as command-line words (:func:`ml_debug.core.options.to_argv`):
a rank runs ``mldebug <command> <words>`` and rebuilds the same configuration from them. Other nodes
are reached the same way, by :func:`ml_debug.remote.runner.on_every_node`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ml_debug.core import output
from ml_debug.core.errors import ExitCode
from ml_debug.core.options import to_argv
from ml_debug.dist.options import SpawnOptions


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
                linger_s: float = 30.0, extra: Sequence[str] = ()) -> int:
    """Run ``mldebug <command>`` as ``--nproc-per-node`` ranks of a (multi-node) world; the exit code.

    Rank 0 prints the verdict. A rank killed or stopped is named on stderr, and the run is partial.
    """
    from ml_debug.dist.spawn import SpawnSpec
    from ml_debug.dist.spawn import spawn as run_ranks

    nproc = launch.nproc_per_node or (gpus or 2)
    spec = SpawnSpec(nproc, nnodes=launch.nnodes, node_rank=launch.node_rank, master_addr=launch.master_addr,
                      master_port=launch.master_port, rdzv_timeout_s=rdzv_timeout_s, run_timeout_s=run_timeout_s,
                      linger_s=linger_s, cpu_ranks=not gpus)
    result = run_ranks(forward_argv(command, *configs, extra=extra), spec)
    if result.stopped:
        ranks = ", ".join(map(str, result.stopped))
        output.warn(f"rank{'s' if len(result.stopped) > 1 else ''} {ranks} still running {linger_s:g} s after "
                    "another rank finished: stopped (hung?)")
    if result.timed_out and run_timeout_s:
        output.warn(f"{command} ranks did not finish within {run_timeout_s:g} s; they were stopped")
    code = result.code
    if code == ExitCode.PARTIAL:
        killed = sorted(r for r, c in result.exit_codes.items() if c < 0 and r not in result.stopped)
        if killed:
            output.warn(f"some ranks did not finish (killed or crashed: {killed})")
    elif code == ExitCode.OK and any(c != 0 for c in result.exit_codes.values()):
        bad = {r: c for r, c in result.exit_codes.items() if c != 0}
        output.warn(f"rank 0 finished but other ranks failed: {bad}")
        code = ExitCode.PROBLEM
    return int(code)
