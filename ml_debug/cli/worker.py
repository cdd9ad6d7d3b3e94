"""Entry points of rank processes.

- ``python -m ml_debug.cli.worker <command> [args]``: a self-launched rank. It runs the mldebug
  command, writes its exit code where the launcher reads it (MLDEBUG_LAUNCH_DIR/rank<R>.rc), then
  exits 0: torch's elastic agent kills every other rank as soon as one exits non-zero, which would cut
  off the rank still printing the verdict.
- ``torchrun -m ml_debug.train [args]``: the same as ``mldebug train`` (see :func:`train_main`).

How a rank process exits is :mod:`ml_debug.cli.exits`' (the app uses it too, and never imports this
module: the entry points sit above the app).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from ml_debug.cli.exits import exit_cli, finish


def run_rank(argv: list[str]) -> int:
    """Run one self-launched rank's command; the exit code goes to the launcher's file, 0 to the agent."""
    from ml_debug.cli.app import run

    code = run(argv)
    launch_dir = os.environ.get("MLDEBUG_LAUNCH_DIR")
    if not launch_dir:
        return code
    path = os.path.join(launch_dir, f"rank{os.environ.get('RANK', '0')}.rc")
    with open(path + ".tmp", "w") as fh:
        fh.write(str(code))
    os.replace(path + ".tmp", path)
    return 0


def train_main() -> NoReturn:
    """``torchrun -m ml_debug.train [options]``: the same as ``mldebug train [options]``."""
    from ml_debug.cli.app import run

    exit_cli(run(["train", *sys.argv[1:]]))


if __name__ == "__main__":
    from ml_debug.core.lifecycle import adopt_parent_tie

    adopt_parent_tie()  # the launcher set it: this rank dies with it, even when it is SIGKILLed
    finish(run_rank(sys.argv[1:]))
