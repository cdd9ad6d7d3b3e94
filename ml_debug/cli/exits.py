"""The one way a rank process exits, and how the `mldebug` command exits (the app and the rank entry
points both use it; it imports neither)."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

__all__ = ["exit_cli", "finish", "is_rank_process"]


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
