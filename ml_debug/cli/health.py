"""`mldebug health`: GPU and host health checks with verdicts, on this node or many."""

from __future__ import annotations

import typer

from ml_debug.health.model import HealthResult
from ml_debug.health.options import HealthOptions
from ml_debug.remote.options import TargetOptions

HELP = """Is the hardware healthy? NVML checks (ECC, row remapping, throttling, temperature, power,
PCIe, NVLink, leftover processes, Xid events), host checks (swap, D-state processes, /dev/shm,
open-file limit, disk and inodes, clock sync, CPU governor) and, with --level 2/3, a matmul
stress test with result checking, a memory pattern test and copy bandwidth, flagging the GPU
slower than the median of its identical siblings.

Exit codes: 0 healthy (also a node without NVIDIA GPU when none was expected); 1 a check
failed; 3 --expect-gpus N>0 or --require-gpu but no NVIDIA GPU; 4 some nodes never answered."""

EXAMPLES = (
    "mldebug health                                    # quick checks of this node",
    "mldebug health --level 2 --expect-gpus 8          # + stress, memory and copy tests",
    "mldebug health --hosts node[01-16] --brief        # many nodes over ssh: only what is wrong",
    "mldebug health --slurm-job 12345",
)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "health", health, help=HELP, examples=EXAMPLES, opts=HealthOptions, targets=TargetOptions)


def health(opts: HealthOptions, targets: TargetOptions) -> int:

    from ml_debug.core import output, safefs

    opts.validate()
    if opts.out_dir is not None:  # an unusable --out-dir is said before the checks, not after them
        safefs.make_out_dir(opts.out_dir)
    if not targets.remote:
        from ml_debug.health.cluster import local_result
        from ml_debug.health.runner import run_local

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
