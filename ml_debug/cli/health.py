"""`mldebug health`: GPU and host health checks with verdicts, on this node or many."""

from __future__ import annotations

import typer

from ml_debug.health.options import HealthOptions
from ml_debug.health.result import HealthResult
from ml_debug.remote.options import TargetOptions
from ml_debug.slurmhook.options import SlurmCheckOptions

HELP = """Is the hardware healthy? NVML checks (ECC, row remapping, throttling, temperature, power,
PCIe, NVLink, leftover processes, Xid events), host checks (swap, D-state processes, /dev/shm,
open-file limit, disk and inodes, clock sync, CPU governor) and, with --level 2/3, a matmul
stress test with result checking, a memory pattern test and copy bandwidth, flagging the GPU
slower than the median of its identical siblings.

Exit codes: 0 healthy (also a node without NVIDIA GPU when none was expected); 1 a check
failed; 3 --expect-gpus N>0 or --require-gpu but no NVIDIA GPU; 4 some nodes never answered.
With --slurm-check: 0 healthy (resumed if mldebug had drained it); 1 a check failed (drained);
2 unknown node; 3 no scontrol, or this user may not update nodes."""

EXAMPLES = (
    "mldebug health                                    # quick checks of this node",
    "mldebug health --level 2 --expect-gpus 8          # + stress, memory and copy tests",
    "mldebug health --hosts node[01-16] --brief        # many nodes over ssh: only what is wrong",
    "mldebug health --slurm-job 12345",
    "mldebug health --slurm-check                      # as Slurm's HealthCheckProgram: drain/resume this node",
    "mldebug health --slurm-check --dry-run            # what it would drain or resume",
)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "health", health, help=HELP, examples=EXAMPLES, opts=HealthOptions, targets=TargetOptions,
            slurm=SlurmCheckOptions)


def health(opts: HealthOptions, targets: TargetOptions, slurm: SlurmCheckOptions) -> int:

    from ml_debug.core import output, safefs

    opts.validate()
    if opts.level >= 2 and not targets.remote:
        from ml_debug.core.extras import require_torch

        require_torch(f"mldebug health --level {opts.level} (the stress tests)")
    if slurm.slurm_check or slurm.dry_run or slurm.node or slurm.exit_zero:
        return _slurm_check(opts, targets, slurm)
    if opts.out_dir is not None:  # an unusable --out-dir is said before the checks, not after them
        safefs.make_out_dir(opts.out_dir)
    if not targets.remote:
        from ml_debug.health.cluster import local_result
        from ml_debug.health.run import run_local

        result = local_result(run_local(opts))
        if opts.out_dir is not None:
            doc = output.document("mldebug.health", 1, result)
            safefs.write_out(opts.out_dir, "health.json", output.dumps(doc) + "\n")
    else:
        result = _run_many(opts, targets)

    from ml_debug.health.render import draw

    output.emit("mldebug.health", 1, result, lambda console: draw(console, result, verbose=not opts.brief))
    return result.exit_code


def _run_many(opts: HealthOptions, targets: TargetOptions) -> HealthResult:
    from ml_debug.core.output import log
    from ml_debug.health.cluster import merge
    from ml_debug.remote.runner import on_every_node

    spec = targets.resolve()
    level = opts.level
    stress = opts.stress_seconds or {1: 0, 2: 15, 3: 120}[level]
    per_node = opts.timeout or (120.0 + 4 * stress + (60 if level >= 2 else 0))
    log(f"mldebug health: level {level} on {len(spec.targets)} node(s), {per_node:.0f} s timeout per node")
    agents = on_every_node("health", opts, spec, timeout_s=per_node, out_dir=opts.out_dir)
    return merge(agents, level, opts.outlier_pct)


def _slurm_check(opts: HealthOptions, targets: TargetOptions, slurm: SlurmCheckOptions) -> int:
    """The hook Slurm calls: one line on stdout (or --json), exit 0 healthy / 1 failed and drained."""
    from ml_debug.core import output
    from ml_debug.core.errors import UsageError

    if not slurm.slurm_check:
        raise UsageError("--dry-run, --node and --exit-zero go with --slurm-check",
                         "mldebug health --slurm-check --dry-run")
    if targets.remote:
        raise UsageError("--slurm-check checks this node only (slurmd runs it on each node)",
                         "drop --hosts/--slurm-job, or drop --slurm-check to check many nodes")
    from ml_debug.slurmhook.run import run_hook

    result = run_hook(opts, slurm)
    if result.history and result.history.startswith("not recorded"):
        output.warn(f"history {result.history}")
    output.emit("mldebug.slurm-check", 1, result, lambda console: console.print(result.summary, markup=False,
                                                                               highlight=False, soft_wrap=True))
    return result.exit_code
