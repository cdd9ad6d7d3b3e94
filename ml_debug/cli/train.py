"""`mldebug train`: the bundled FSDP2 low-bit training job (and its fault injection)."""

from __future__ import annotations

import typer

from ml_debug.dist.options import DebugRankOptions, OptInSpawnOptions, SpawnOptions
from ml_debug.train.config import TrainConfig

HELP = """Train a small Llama-style model with FSDP2, on CPU (gloo) or GPUs (NCCL), and break it on purpose.

Faults (--inject KIND@step=S,rank=R[,factor=F][,code=C][,where=loss|grad], repeatable):
hang, straggler, crash, segfault, nan, desync, exit. docs/faults.md says which mldebug command
diagnoses each one.

Exit codes: 0 trained (or stopped by the kill switch); 1 a rank failed (non-finite loss named by
rank, a collective failed, an injected crash); 2 bad options; 4 some ranks never finished."""

EXAMPLES = (
    "mldebug train --nproc-per-node 2 --preset tiny --steps 50",
    "torchrun --nproc-per-node 8 -m ml_debug.train --preset 1b --numerics fp8 --steps 100",
    "mldebug train --nproc-per-node 2 --inject hang@step=3,rank=1 --collective-timeout 60",
    "mldebug train --nproc-per-node 2 --checkpoint-dir ckpt --checkpoint-every 10 --metrics-dir m",
    "mldebug train --nproc-per-node 2 --debug-rank 1         # rank 1 waits for VS Code (or any DAP client)",
)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "train", train, help=HELP, examples=EXAMPLES, cfg=TrainConfig, launch=OptInSpawnOptions,
            debug=DebugRankOptions)


def train(cfg: TrainConfig, launch: SpawnOptions, debug: DebugRankOptions | None = None) -> int:
    from ml_debug.core.extras import require, require_torch

    require_torch("mldebug train")
    if cfg.numerics == "fp8":  # before any rank starts: each would fail alike at its first step
        require("torchao", "mldebug train --numerics fp8")
    from ml_debug.dist.world import is_launched

    # Every option is checked before any rank starts (ranks are checked again, knowing the world).
    launching = launch.nproc_per_node is not None and not is_launched()
    if launching:
        from ml_debug.dist.limits import check_nproc

        check_nproc(launch.nproc_per_node or 1, launch.max_nproc_per_node)
    cfg.validate(world_size=(launch.nproc_per_node or 1) * launch.nnodes if launching else 1 << 30)
    wrapper = _debug_wrapper(debug, launch, launching)
    if not launching:
        return _run_rank(cfg)
    from ml_debug.cli.spawn import default_nproc, spawn_ranks

    _, gpus = default_nproc(cfg.backend, cfg.device)
    return spawn_ranks("train", [_absolute_paths(cfg)], launch, gpus=gpus, linger_s=min(cfg.timeout, 30.0) + 10,
                       wrapper=wrapper)


def _debug_wrapper(debug: DebugRankOptions | None, launch: SpawnOptions, launching: bool) -> list[str]:
    """--debug-rank R: every rank through `mldebug launch --debug-rank`'s wrapper (ml_debug.debugger.rank)."""
    if debug is None or debug.debug_rank is None:
        return []
    from ml_debug.core import output
    from ml_debug.core.errors import UsageError
    from ml_debug.core.extras import require

    if not launching:
        raise UsageError("--debug-rank needs the ranks mldebug starts itself (--nproc-per-node N)",
                         "under torchrun or srun: mldebug launch --debug-rank R -- python -m ml_debug.train ...")
    world = (launch.nproc_per_node or 1) * launch.nnodes
    if debug.debug_rank >= world:
        raise UsageError(f"--debug-rank {debug.debug_rank}: the job has ranks 0..{world - 1}",
                         "pick a rank below --nproc-per-node x --nnodes")
    require("debugpy", "mldebug train --debug-rank")
    from ml_debug.dist.options import debug_rank_argv

    return debug_rank_argv(debug.debug_rank, debug.debug_port, debug.debug_no_wait, json=output.MODE.json)


def _absolute_paths(cfg: TrainConfig) -> TrainConfig:
    """Ranks of a segfault drill run from their own core directory: give them paths that still hold."""
    import dataclasses
    from pathlib import Path

    return dataclasses.replace(cfg, **{f.name: getattr(cfg, f.name).resolve() for f in dataclasses.fields(cfg)
                                       if isinstance(getattr(cfg, f.name), Path)})


def _run_rank(cfg: TrainConfig) -> int:
    """This process's part: train, then rank 0 reports."""
    from torch.distributed.elastic.multiprocessing.errors import record

    from ml_debug.core import output
    from ml_debug.core.errors import ProblemFound
    from ml_debug.train.faults import InjectedCrash
    from ml_debug.train.loop import SCHEMA
    from ml_debug.train.loop import train as run_training

    try:
        # record() writes the torchelastic error file (TORCHELASTIC_ERROR_FILE) with the traceback,
        # so `torchrun` names the failing rank and its exception in its summary.
        result = record(run_training)(cfg)
    except InjectedCrash as e:
        raise ProblemFound(str(e), "this was --inject crash; torchrun's summary and the torchelastic error "
                                   "file carry the traceback") from e
    import os

    if int(os.environ.get("RANK", "0")) != 0 or result is None:
        return 0
    output.emit(SCHEMA, 1, result, lambda console: _render(result, console))
    return 0 if result.ok else 1


def _render(result: object, console: object) -> None:
    from rich.table import Table

    from ml_debug.train.loop import TrainResult

    assert isinstance(result, TrainResult)
    table = Table(title=f"mldebug train: {result.summary}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")

    def fmt(x: float | None, spec: str) -> str:
        return "n/a" if x is None else format(x, spec)

    rows = [
        ("model", f"{result.preset} ({result.n_params / 1e6:.2f}M non-embedding params)"),
        ("world", f"{result.world_size} rank(s) on {result.device}"),
        ("numerics", result.numerics),
        ("steps", f"{result.start_step + 1}..{result.last_step} ({result.steps_run} run, {result.stopped_by})"),
        ("final loss", fmt(result.final_loss, ".4f")),
        ("tokens/s per device", fmt(result.tokens_per_s, ",.0f")),
        ("TFLOP/s per device", fmt(result.tflops, ".3g")),
        ("MFU", "n/a (no known peak for this device)" if result.mfu is None else f"{result.mfu * 100:.1f}%"),
        ("step time", "n/a" if result.step_time_s is None else f"{result.step_time_s * 1e3:.1f} ms"),
    ]
    if result.checkpoints:
        rows.append(("checkpoints", ", ".join(result.checkpoints[-2:])))
    if result.profile_trace:
        rows.append(("profile trace", result.profile_trace))
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)  # type: ignore[attr-defined]
