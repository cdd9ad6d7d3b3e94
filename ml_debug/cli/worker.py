"""Entry points of rank processes, and the one way a rank process exits.

- ``python -m ml_debug.cli.worker <command> [args]``: a self-launched rank. It runs the mldebug
  command, writes its exit code where the launcher reads it (MLDEBUG_LAUNCH_DIR/rank<R>.rc), then
  exits 0: torch's elastic agent kills every other rank as soon as one exits non-zero, which would cut
  off the rank still printing the verdict.
- ``torchrun -m ml_debug.train [args]``: the same as ``mldebug train`` (see :func:`train_main`).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def is_rank_process() -> bool:
    """True in a process that joined a multi-rank torch.distributed world."""
    return "torch.distributed" in sys.modules and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1


def finish(code: int) -> NoReturn:
    """Exit now, skipping interpreter finalisation.

    After a gloo process group is destroyed, one of its worker threads can still drop a tensor while
    Python finalizes and abort the process ("terminate called without an active exception", rc 134),
    turning a clean result into a crash. Every result is written before this is called.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def exit_cli(code: int) -> NoReturn:
    """How the `mldebug` command exits: like :func:`finish` in a rank process, else sys.exit."""
    if is_rank_process():
        finish(code)
    sys.exit(code)


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
