"""`mldebug allreduce-bench`: collective bandwidth like nccl-tests, and the slow link named."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from ml_debug.bench.config import BenchConfig
from ml_debug.dist.options import SpawnOptions

if TYPE_CHECKING:
    from collections.abc import Callable

    from ml_debug.bench.sweep import BenchResult
    from ml_debug.core.errors import PartialResult

HELP = """Measure collective bandwidth (algbw, busbw) over a size sweep, with nccl-tests' definitions.

Alone it starts its own ranks (one per GPU, or 2 CPU ranks); it also runs under torchrun, srun and
mpirun. Every size is checked for wrong elements after timing; a straggler rank is named.
`--pairwise` measures every pair of nodes (or ranks) and names slow links and nodes.

Exit codes: 0 all good; 1 wrong data, a straggler, a slow link or busbw below --expect-busbw;
2 bad options; 3 something missing (matplotlib for --plot, a GPU for --backend nccl);
4 some ranks never answered."""

EXAMPLES = (
    "mldebug allreduce-bench                           # all_reduce, 1K..16M on CPU, 1K..1G on GPU",
    "mldebug allreduce-bench -C all -b 1M -e 64M -f 4",
    "torchrun --nproc-per-node 8 --no-python mldebug allreduce-bench -- -e 8G",
    "mldebug allreduce-bench --pairwise --plot links.png",
)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "allreduce-bench", allreduce_bench, help=HELP, examples=EXAMPLES, cfg=BenchConfig,
            launch=SpawnOptions)


def allreduce_bench(cfg: BenchConfig, launch: SpawnOptions) -> int:
    from ml_debug.core.extras import require_torch

    require_torch("mldebug allreduce-bench")
    from ml_debug.core import output
    from ml_debug.dist.world import is_launched

    cfg.validate(as_json=output.MODE.json)
    if is_launched():
        return _run_rank(cfg)
    from ml_debug.cli.spawn import default_nproc, ranks_to_start, spawn_ranks

    nproc, gpus = default_nproc(cfg.backend, cfg.device)
    cfg.check_world(ranks_to_start(launch, gpus) * launch.nnodes)
    return spawn_ranks("allreduce-bench", [cfg], launch, gpus=gpus, rdzv_timeout_s=max(cfg.timeout, 30.0),
                       linger_s=min(cfg.timeout, 30.0) + 10)


def _run_rank(cfg: BenchConfig) -> int:
    """One rank's part under a launcher; rank 0 reports. Returns this rank's exit code (the verdict).

    Rank 0 reports before the group's closing barrier: torchrun stops every rank as soon as one exits
    non-zero, so no rank may leave with the verdict before the verdict is printed.
    """
    from ml_debug.core.errors import PartialResult, first_line
    from ml_debug.dist.device import choose_device
    from ml_debug.dist.group import distributed, is_collective_error
    from ml_debug.dist.world import detect_world

    world = detect_world()
    cfg.check_world(world.world_size)
    choice = choose_device(world, cfg.device, cfg.backend)
    with distributed(world, choice, cfg.timeout):
        try:
            if cfg.pairwise:
                from ml_debug.bench.pairwise import run_pairwise

                result = run_pairwise(cfg, world, choice.device, choice.backend)
            else:
                from ml_debug.bench.sweep import run_sweep

                result = run_sweep(cfg, world, choice.device, choice.backend)
        except Exception as e:  # a peer stopped answering mid-run: no numbers to report, and no bug of ours
            if not is_collective_error(e):
                raise
            raise PartialResult(f"rank {world.rank}: a collective failed: {first_line(e)}",
                                "another rank is hung, slow or gone: `mldebug dump-stacks --local` (or --slurm-job) "
                                "names it") from e
        failed_write = _report(cfg, result) if world.rank == 0 else None
    if failed_write is not None:  # raised after the closing barrier, which the other ranks need to leave cleanly
        raise failed_write
    return 0 if result.ok else 1


def _report(cfg: BenchConfig, result: BenchResult) -> PartialResult | None:
    """Print the result, then write --plot and --csv; a write that failed, for the caller to raise.

    Files come last: a write that fails at the end (disk full, the directory gone) must not lose the
    numbers, which took the whole sweep. The paths were checked before any rank started.
    """
    import sys
    from pathlib import Path

    from ml_debug.bench.render import render, to_csv
    from ml_debug.bench.sweep import SCHEMA, SCHEMA_VERSION
    from ml_debug.core import output, safefs
    from ml_debug.core.environment import summary
    from ml_debug.core.errors import PartialResult

    env = summary()
    writes: list[tuple[str, Callable[[], object]]] = []
    if cfg.plot is not None:
        from ml_debug.bench.plot import plot as draw

        plot = cfg.plot
        writes.append((str(plot), lambda: draw(result, plot).note))
        result.notes.append(f"plot: {plot}")
    if cfg.csv == "-":
        sys.stdout.write(to_csv(result))
        sys.stdout.flush()
    else:
        if cfg.csv is not None:
            csv = Path(cfg.csv)
            writes.append((str(csv), lambda: safefs.write_file("--csv", csv, to_csv(result))))
            result.notes.append(f"CSV: {csv}")
        output.emit(SCHEMA, SCHEMA_VERSION, result, lambda console: render(result, env, console), environment=env)
    from ml_debug.core.errors import MLDebugError

    for path, write in writes:
        try:
            note = write()
        except (OSError, safefs.Refused, MLDebugError) as e:
            why = e.message if isinstance(e, MLDebugError) else (getattr(e, "strerror", None) or e)
            return PartialResult(f"the result above is complete, but {path} could not be written: {why}",
                                 "free space or fix the path, and run again")
        if isinstance(note, str):  # a link planted at the name was replaced, not followed
            output.warn(note)
    return None
