"""`mldebug drill`: rehearse on-call: inject each classic failure and score mldebug's diagnosis."""

from __future__ import annotations

import typer

from ml_debug.drill.options import DrillOptions
from ml_debug.remote.options import TargetOptions

HELP = """Fire drills: inject each classic failure into a real job, run the diagnosis a user
would run, and score whether it named the injected rank (node, function), and how fast. With --hosts
each drill's job spans those hosts (over ssh); with --slurm-partition it is a Slurm job.

hang -> dump-stacks; straggler -> watch; crash, segfault, nan, exit -> logs of `mldebug launch`;
desync -> dump-stacks with the Flight Recorder; missing-rank -> gpu-test; slow-link ->
allreduce-bench --pairwise. The rank (and step) of each fault is drawn at random (--seed repeats a run).
Every process a drill starts is stopped when it ends, whatever happened.

Exit codes: 0 every drill named the injected rank; 1 a drill was missed (the score table says what was
named instead); 2 bad options; 4 a drill could not run to a verdict; 130 interrupted (the finished
drills are reported)."""

EXAMPLES = (
    "mldebug drill                                   # every drill, 2 ranks each",
    "mldebug drill --only hang,crash --seed 7",
    "mldebug drill --nproc-per-node 4 --bundle-dir drills/ --json",
    "mldebug drill --hosts 'node[1-3]' --bundle-dir /shared/drills     # each job over the hosts, by ssh",
    "mldebug drill --slurm-partition debug --bundle-dir /shared/drills # each job a 2-node Slurm job",
)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "drill", drill, help=HELP, examples=EXAMPLES, opts=DrillOptions, targets=TargetOptions)


def drill(opts: DrillOptions, targets: TargetOptions) -> int:
    from ml_debug.core.extras import require_torch

    require_torch("mldebug drill")
    from ml_debug.core import output
    from ml_debug.core.errors import ExitCode
    from ml_debug.drill.render import outcome_line, render
    from ml_debug.drill.result import SCHEMA, SCHEMA_VERSION
    from ml_debug.drill.run import run_drills

    result = run_drills(opts, targets, on_outcome=lambda o: output.log(outcome_line(o)))
    output.emit(SCHEMA, SCHEMA_VERSION, result, lambda console: render(result, console))
    if result.missed:
        return ExitCode.PROBLEM
    if result.interrupted:
        return ExitCode.INTERRUPTED
    return ExitCode.PARTIAL if result.errors else ExitCode.OK
