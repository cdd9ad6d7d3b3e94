"""`mldebug watch`: notice that a running job hangs or crawls, and hand over the diagnosis."""

from __future__ import annotations

import typer

from ml_debug.remote.options import TargetOptions
from ml_debug.watch.options import WatchOptions

HELP = """Watch a running job and, when a rank stops making progress or crawls, collect the evidence.

Finds the job's ranks as dump-stacks does (the children of torchrun/srun/mpirun/deepspeed and
`mldebug <command> --nproc-per-node`, or --pid/--pattern/--env), samples each rank's CPU time and
state, its GPU's utilisation and power, and the files named by --progress-file every --interval
(on many nodes one small agent per node streams them), and its stack with py-spy every
--stack-every. A rank without progress for --stall seconds is stalled; a rank far below the median
step rate, or computing while its peers wait for it in collectives, is a straggler. Then it writes
an incident bundle (dump-stacks with the suspect and the Flight Recorder's cross-rank analysis,
health of the suspect's node, the tails of the progress files, env) whose summary.md leads with
one sentence: which rank, where, since when, and the command to run next.

Exit codes: 0 nothing happened (the job ended, or --duration passed); 1 an incident (bundle
written; with --now: a culprit named); 2 bad usage; 3 no job process found; 4 a node stopped
answering and the job could not be judged; 130 interrupted (the bundle so far is kept)."""

EXAMPLES = (
    "mldebug watch --local --stall 600",
    "mldebug watch --slurm-job 12345 --progress-file 'run/metrics/rank-{rank}.jsonl'",
    "mldebug watch --hosts node[01-04] --env MLDEBUG_JOB=run7 --on-incident 'scancel 12345'",
    "mldebug watch --pid 4242 --now                 # the bundle, at once",
)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "watch", watch, help=HELP, examples=EXAMPLES, opts=WatchOptions, targets=TargetOptions)


def watch(opts: WatchOptions, targets: TargetOptions) -> int:
    from ml_debug.compose.watch_loop import run_watch

    opts.validate(remote=targets.remote)
    if not targets.remote and opts.stack_every > 0:  # said now, not as a hole in the first incident's bundle
        from ml_debug.core.extras import require

        require("py-spy", "mldebug watch (its stack rounds and the incident's stacks)",
                instead="--stack-every 0 watches without stack rounds")
    if opts.out_dir is not None:  # a planted link or another user's directory: said now, not at the incident
        from ml_debug.core import safefs

        safefs.check_out_dir(opts.out_dir, "--bundle-dir")  # made at the first incident
    if opts.html is not None:
        from ml_debug.page.build import check_target

        check_target("--html", opts.html)
    return run_watch(targets.resolve(), opts)
