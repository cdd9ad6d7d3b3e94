"""The options of `mldebug check` (cheap to import: the CLI builds its options from them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ml_debug.core.errors import UsageError
from ml_debug.core.options import option, parse_out_dir


@dataclass(frozen=True)
class CheckOptions:
    """The options of `mldebug check`."""

    skip: list[str] = option(default_factory=list, metavar="STEP[,STEP]",
                             help="Leave out steps (comma-separated or repeated): env, gpu-test, health, "
                                  "allreduce-bench.")
    step_timeout: float | None = option(None, min=1.0, metavar="S", help="Seconds per step (default: each step's own).")
    out_dir: Path | None = option(None, metavar="DIR", parse=parse_out_dir,
                                  help="Also write each step's document and stderr here as the step ends, so "
                                       "the steps already done are kept on Ctrl-C or a crash.")

    def skipped(self) -> list[str]:
        """The steps --skip names; an unknown name, or no step left to run, is a usage error."""
        from ml_debug.compose.check import DEFAULT_STEPS

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
