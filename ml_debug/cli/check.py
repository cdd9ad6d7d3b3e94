"""`mldebug check`: the whole-node checkup (env, gpu-test, health, allreduce-bench) in one verdict."""

from __future__ import annotations

import typer

from ml_debug.compose.check_options import CheckOptions

SCHEMA = "mldebug.check"

HELP = """Check this node in one go: `mldebug env`, `mldebug gpu-test` across the local devices (2 CPU
ranks without a GPU), `mldebug health --level 1` and `mldebug allreduce-bench --quick`, each run with
--json and a timeout, summarised in one table. Works on a machine without a GPU.

Exit codes: 0 every step passed; 1 a step found a problem; 2 bad options (also a --skip that leaves
nothing to run); 4 a step timed out or was partial."""

EXAMPLES = (
    "mldebug check",
    "mldebug check --skip gpu-test,allreduce-bench --out-dir checkup/",
    "mldebug --json check | jq .result.summary",
)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "check", check, help=HELP, examples=EXAMPLES, opts=CheckOptions)


def check(opts: CheckOptions) -> int:
    from ml_debug.compose import check as checkup
    from ml_debug.core import output, safefs

    skipped = opts.skipped()
    if opts.out_dir is not None:  # an unusable --out-dir is said before the steps, not after them
        safefs.make_out_dir(opts.out_dir)
    result = checkup.run_check(skip=skipped, timeout_s=opts.step_timeout, out_dir=opts.out_dir)
    output.emit(SCHEMA, 1, result, lambda console: checkup.render(result, console))
    return result.exit_code
