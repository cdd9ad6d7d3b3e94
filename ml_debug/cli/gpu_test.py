"""`mldebug gpu-test`: can every rank and GPU talk, and which one cannot."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from ml_debug.dist.options import SpawnOptions
from ml_debug.gputest.options import GpuTestConfig

if TYPE_CHECKING:
    from ml_debug.gputest.verdict import GpuTestResult

SCHEMA = "mldebug.gpu-test"

HELP = """Check that every rank and GPU can talk: device, allocation, rendezvous, init, an all_reduce with an
exactly known sum, an all_gather of identities (two ranks on one GPU, wrong layout), broadcast, a p2p
ring and a barrier that names absent ranks. Every stage has a timeout; rank 0 prints one verdict.

Runs under torchrun, srun (one task per GPU) or mpirun; alone it launches one rank per visible GPU,
or 2 CPU ranks without a GPU.

Exit codes: 0 all OK; 1 a stage failed; 2 bad options; 4 some ranks never answered."""

EXAMPLES = (
    "mldebug gpu-test                                  # one rank per GPU (2 CPU ranks without one)",
    "torchrun --nproc-per-node 8 --no-python mldebug gpu-test",
    "srun --ntasks-per-node 8 mldebug gpu-test --stage-timeout 60",
    "mldebug gpu-test --isolate                        # find the one bad GPU or link",
)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "gpu-test", gpu_test, help=HELP, examples=EXAMPLES, cfg=GpuTestConfig, launch=SpawnOptions)


def gpu_test(cfg: GpuTestConfig, launch: SpawnOptions) -> int:
    from ml_debug.core.extras import require_torch

    require_torch("mldebug gpu-test")
    from ml_debug.core.errors import UsageError
    from ml_debug.dist.world import detect_world, is_launched

    if is_launched():
        if cfg.isolate:
            raise UsageError("--isolate launches its own ranks and cannot run under torchrun/srun/mpirun",
                             "run `mldebug gpu-test --isolate` once per node, without a launcher")
        return _run_as_rank(cfg)
    if cfg.out_dir is not None:  # a --out-dir that cannot be made (and checked to be ours): before torch loads
        from ml_debug.core import safefs

        safefs.claim_out_dir(cfg.out_dir)  # held by this launcher while its ranks write there
    from ml_debug.dist.device import choose_device, visible_gpus

    wants_cpu = cfg.device == "cpu" or (cfg.backend == "gloo" and cfg.device == "auto")
    gpus = 0 if wants_cpu else visible_gpus()
    choose_device(detect_world(), cfg.device, cfg.backend, gpu_count=gpus)  # bad options fail here, not in N ranks
    from ml_debug.cli.spawn import ranks_to_start

    nproc = ranks_to_start(launch, gpus)  # a count the node cannot run is refused before anything starts
    run_timeout = cfg.init_timeout * 2 + (cfg.timeout_s + 5) * 8 + 60
    # the nodes' rendezvous is part of the init: a node that never joins is named within --init-timeout
    rdzv = cfg.init_timeout
    if cfg.isolate:
        return _isolate(cfg, nproc, gpus, max(30.0, rdzv), run_timeout)
    from ml_debug.cli.spawn import spawn_ranks

    return spawn_ranks("gpu-test", [cfg], launch, gpus=gpus, rdzv_timeout_s=rdzv if launch.nnodes > 1 else 30.0,
                       run_timeout_s=run_timeout, linger_s=cfg.timeout_s + 3 * cfg.grace_s + 10)


def _run_as_rank(cfg: GpuTestConfig) -> int:
    import os

    from ml_debug.core import output, safefs
    from ml_debug.dist.world import detect_world
    from ml_debug.gputest.render import render
    from ml_debug.gputest.stages import run_rank

    def deliver(result: GpuTestResult) -> None:
        doc = output.dumps(output.document(SCHEMA, 1, result)) + "\n"
        if cfg.report_to is not None:
            safefs.write_file("--report-to", cfg.report_to, doc)
        if cfg.out_dir is not None:  # never through a link planted in --out-dir
            safefs.write_out(cfg.out_dir, "gpu-test.json", doc)
        if cfg.report_to is None:
            output.emit(SCHEMA, 1, result, lambda console: render(result, console))

    world = detect_world()
    if cfg.out_dir is not None and world.rank == 0 and "MLDEBUG_LAUNCH_DIR" not in os.environ:
        # under torchrun, srun or mpirun rank 0 holds --out-dir for the run (a self-launched rank's
        # launcher holds it already): another run's rank 0 is refused instead of appending to our files
        safefs.claim_out_dir(cfg.out_dir)
    outcome = run_rank(cfg, world, deliver)
    return outcome.exit_code


def _isolate(cfg: GpuTestConfig, n: int, gpus: int, rdzv_timeout_s: float, run_timeout_s: float) -> int:
    import dataclasses

    from ml_debug.core import output
    from ml_debug.core.options import to_argv
    from ml_debug.gputest.isolate import render, run_isolation, visible_members

    members = visible_members(n) if gpus else list(range(n))
    # Each group reports through --report-to; the per-rank --out-dir records are not wanted here.
    argv = to_argv(dataclasses.replace(cfg, out_dir=None))
    result = run_isolation(members, bool(gpus), argv, rdzv_timeout_s=rdzv_timeout_s, run_timeout_s=run_timeout_s)
    if cfg.out_dir is not None:
        from ml_debug.core.safefs import write_out

        write_out(cfg.out_dir, "gpu-test-isolate.json", output.dumps(output.document(SCHEMA, 1, result)) + "\n")
    output.emit(SCHEMA, 1, result, lambda console: render(result, console))
    return result.exit_code

