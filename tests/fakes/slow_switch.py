"""`mldebug train`'s rank 0 slow to delete the save switch file (``MLDEBUG_TEST_HOOKS=tests.fakes.slow_switch``):
the other ranks, quick to their next step, must not read the switch again before it is gone (they saved twice)."""

from __future__ import annotations

import time


def train_save_switch_done(rank: int) -> None:
    if rank == 0:
        time.sleep(2)
