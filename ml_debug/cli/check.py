"""`mldebug check`: the whole-node checkup (env, gpu-test, health, allreduce-bench) in one verdict."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

from ml_debug.core.errors import UsageError
from ml_debug.core.options import option, parse_out_dir

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


@dataclass(frozen=True)
class CheckOptions:
    """The options of `mldebug check`."""

    skip: list[str] = option(default_factory=list, metavar="STEP[,STEP]",
                             help="Leave out steps (comma-separated or repeated): env, gpu-test, health, "
                                  "allreduce-bench.")
    step_timeout: float | None = option(None, min=1.0, help="Seconds per step (default: each step's own).")
    out_dir: Path | None = option(None, metavar="DIR", parse=parse_out_dir,
                                  help="Also write each step's document and stderr here as the step ends, so "
                                       "the steps already done are kept on Ctrl-C or a crash.")

    def skipped(self) -> list[str]:
        """The steps --skip names; an unknown name, or no step left to run, is a usage error."""
        from ml_debug.checkup import DEFAULT_STEPS

        names = [s.name for s in DEFAULT_STEPS]
        for word in self.skip:  # an empty word (an unset shell variable) or commas alone would skip nothing
            if not [n for n in word.split(",") if n.strip()]:
                raise UsageError(f"--skip {word!r} names no step", f"steps: {','.join(names)}")
        skipped = [n.strip() for word in self.skip for n in word.split(",") if n.strip()]
        for name in skipped:
            if name not in names:
                raise UsageError(f"unknown step {name!r} for --skip", f"steps: {','.join(names)}")
        if set(names) <= set(skipped):
            raise UsageError("--skip leaves nothing to run", "skip fewer steps; steps: " + ",".join(names))
        return skipped


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "check", check, help=HELP, examples=EXAMPLES, opts=CheckOptions)


def check(opts: CheckOptions) -> int:

    from ml_debug import checkup
    from ml_debug.core import output, safefs

    skipped = opts.skipped()
    if opts.out_dir is not None:  # an unusable --out-dir is said before the steps, not after them
        safefs.make_out_dir(opts.out_dir)
    result = checkup.run_check(skip=skipped, timeout_s=opts.step_timeout, out_dir=opts.out_dir)
    output.emit(SCHEMA, 1, result, lambda console: checkup.render(result, console))
    return result.exit_code
