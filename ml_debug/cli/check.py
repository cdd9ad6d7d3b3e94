"""`mldebug check`: the whole-node checkup (env, gpu-test, health, allreduce-bench) in one verdict."""

from __future__ import annotations

from typing import Annotated

import typer

from ml_debug.cli.options import Json, OutDir

SCHEMA = "mldebug.check"

HELP = """Check this node in one go: `mldebug env`, `mldebug gpu-test` across the local devices (2 CPU
ranks without a GPU), `mldebug health --level 1` and `mldebug allreduce-bench --quick`, each run with
--json and a timeout, summarised in one table. Works on a machine without a GPU.
Exit: 0 every step passed; 1 a step found a problem; 4 a step timed out or was partial."""


def register(app: typer.Typer) -> None:
    app.command("check", help=HELP)(check)


def check(
    json_: Json = False,
    out_dir: OutDir = None,
    skip: Annotated[list[str] | None, typer.Option("--skip", help="Leave out a step (repeatable): "
                                                   "env, gpu-test, health, allreduce-bench.")] = None,
    step_timeout: Annotated[float | None, typer.Option("--step-timeout", min=1.0,
                                                       help="Seconds per step (default: each step's own).")] = None,
) -> None:
    from ml_debug import checkup
    from ml_debug.cli.options import use_json
    from ml_debug.core import output
    from ml_debug.core.errors import UsageError

    as_json = use_json(json_)
    names = {s.name for s in checkup.DEFAULT_STEPS}
    for name in skip or []:
        if name not in names:
            raise UsageError(f"unknown step {name!r} for --skip", f"steps: {', '.join(sorted(names))}")
    result = checkup.run_check(skip=skip or [], timeout_s=step_timeout, out_dir=out_dir)
    output.emit(SCHEMA, 1, result, lambda console: checkup.render(result, console), as_json=as_json)
    if result.exit_code:
        raise typer.Exit(result.exit_code)
