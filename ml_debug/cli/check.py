"""`mldebug check`: the whole-node checkup (env, gpu-test, health, allreduce-bench) in one verdict."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

from ml_debug.core.options import option

SCHEMA = "mldebug.check"

HELP = """Check this node in one go: `mldebug env`, `mldebug gpu-test` across the local devices (2 CPU
ranks without a GPU), `mldebug health --level 1` and `mldebug allreduce-bench --quick`, each run with
--json and a timeout, summarised in one table. Works on a machine without a GPU.

Exit codes: 0 every step passed; 1 a step found a problem; 2 bad options; 4 a step timed out or was
partial."""

EXAMPLES = (
    "mldebug check",
    "mldebug check --skip allreduce-bench --out-dir checkup/",
    "mldebug --json check | jq .result.summary",
)


@dataclass(frozen=True)
class CheckOptions:
    """The options of `mldebug check`."""

    skip: list[str] = option(default_factory=list,
                             help="Leave out a step (repeatable): env, gpu-test, health, allreduce-bench.")
    step_timeout: float | None = option(None, min=1.0, help="Seconds per step (default: each step's own).")
    out_dir: Path | None = option(None, file_okay=False,
                                  help="Also write each step's document here as it arrives, so nothing is lost on "
                                       "Ctrl-C or a crash.")


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "check", check, help=HELP, examples=EXAMPLES, opts=CheckOptions)


def check(opts: CheckOptions) -> int:
    from ml_debug import checkup
    from ml_debug.core import output
    from ml_debug.core.errors import UsageError

    names = {s.name for s in checkup.DEFAULT_STEPS}
    for name in opts.skip:
        if name not in names:
            raise UsageError(f"unknown step {name!r} for --skip", f"steps: {', '.join(sorted(names))}")
    result = checkup.run_check(skip=opts.skip, timeout_s=opts.step_timeout, out_dir=opts.out_dir)
    output.emit(SCHEMA, 1, result, lambda console: checkup.render(result, console))
    return result.exit_code
