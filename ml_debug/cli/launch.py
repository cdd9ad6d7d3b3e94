"""`mldebug launch`: torchrun with logs that `mldebug logs` reads (every line says its node and rank)."""

from __future__ import annotations

import typer

from ml_debug.launch.options import LaunchJobOptions

HELP = """Run a training script under torchrun with labelled, tee'd, per-rank logs.

Every console line says its node, local rank and global rank ([node12:5 rank37]:); torchrun's
per-rank stdout/stderr and error files (TORCHELASTIC_ERROR_FILE) go under the same directory as a
copy of the console, so `mldebug logs LOG_DIR` names the rank that failed first. The host name and
every argument are passed as argument lists: no `$(hostname -s)` quoting trap under srun.
Optional: --trace (each rank under `mldebug trace --ring`), --flight-recorder (PyTorch's Flight
Recorder on, dumps under LOG_DIR). Put the script after `--`; `python` and `python -m` are
understood there.

Exit codes: the job's (torchrun's) exit code: 0 when every rank succeeded, 1 when one failed (the
`mldebug logs` verdict is printed on stderr); 2 bad options; 130 interrupted."""

EXAMPLES = (
    "mldebug launch --nproc-per-node 8 -- python train.py --lr 1e-3",
    "mldebug launch --nproc-per-node 4 --log-dir logs -- python -m ml_debug.train --preset tiny",
    "srun mldebug launch --nnodes $SLURM_NNODES --nproc-per-node 8 --rdzv-backend c10d "
    "--rdzv-endpoint $MASTER_ADDR:29500 --rdzv-id $SLURM_JOB_ID -- python train.py",
    "mldebug launch --nproc-per-node 8 --trace --flight-recorder -- python train.py",
)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    # Stop option parsing at the script: its own options belong to it.
    command(app, "launch", launch, help=HELP, examples=EXAMPLES,
            context_settings={"allow_interspersed_args": False}, opts=LaunchJobOptions)


def launch(opts: LaunchJobOptions) -> int:
    import shlex

    from ml_debug.core import output
    from ml_debug.core.errors import UsageError
    from ml_debug.core.extras import require
    from ml_debug.launch.run import CONSOLE, plan, prepare, run

    require("torch", "mldebug launch (torchrun is part of torch)")  # not a job log that says it
    if opts.nproc_per_node.isdigit():  # a rank count the node cannot run is refused before torchrun starts
        import os

        from ml_debug.dist.limits import check_nproc

        limit = os.environ.get("MLDEBUG_MAX_NPROC_PER_NODE", "").strip()
        check_nproc(int(opts.nproc_per_node), int(limit) if limit.isdigit() and int(limit) > 0 else None,
                    raise_with="MLDEBUG_MAX_NPROC_PER_NODE=N")
    if opts.nproc_per_node == "gpu":  # torchrun would end in its own traceback ("Cuda is not available")
        from ml_debug.core.errors import EnvironmentProblem
        from ml_debug.dist.device import visible_gpus

        if not visible_gpus():
            raise EnvironmentProblem("--nproc-per-node gpu: this node has no GPU that torch can use",
                                     "give a number of ranks (--nproc-per-node 2 runs CPU ranks), or launch on a "
                                     "GPU node (`mldebug env` says what torch sees)")
    if output.MODE.json:  # accepted like every command's --json, it was ignored: say so before the job runs
        raise UsageError("mldebug launch prints no JSON document: its stdout is the ranks' own output",
                         "run the job without --json, then read it as JSON: mldebug logs --json LOG_DIR")
    p = plan(opts)
    prepare(p)
    output.log(f"mldebug launch: logs in {p.node_dir} (console: {p.node_dir / CONSOLE})")
    code = run(p, timeout=opts.timeout)
    top = p.node_dir.parent
    output.log(f"mldebug launch: exit code {code}; read the logs with: mldebug logs {shlex.quote(str(top))}")
    if code != 0 and opts.verdict:
        _verdict(str(p.node_dir))
    return code


def _verdict(path: str) -> None:
    from ml_debug.core import output
    from ml_debug.core.errors import MLDebugError
    from ml_debug.logs.triage import triage

    try:
        report = triage([path])
    except MLDebugError as e:  # the job failed before writing anything: say so, keep its exit code
        output.warn(f"no verdict: {e.message}")
        return
    output.log(f"mldebug logs: {report.verdict.summary}")
    if report.verdict.basis:
        output.log(f"  (order: {report.verdict.basis})")
