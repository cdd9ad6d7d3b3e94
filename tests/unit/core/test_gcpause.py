"""core/gcpause.py: the cycle collector held off for a block, and tuned while a sampling client runs;
whatever was set before is back afterwards."""

from __future__ import annotations

import gc

from ml_debug.core.gcpause import ROUND_THRESHOLDS, gc_paused, tuned_for_rounds


def test_paused_inside_and_restored_as_it_was() -> None:
    was = gc.isenabled()
    gc.enable()
    try:
        with gc_paused():
            assert not gc.isenabled()
            with gc_paused():  # nested: the outer one restores
                pass
            assert not gc.isenabled()
        assert gc.isenabled()
        gc.disable()
        with gc_paused():
            pass
        assert not gc.isenabled()  # it was off: it stays off
    finally:
        (gc.enable if was else gc.disable)()


def test_tuned_for_rounds_freezes_the_start_up_heap_and_restores_the_thresholds() -> None:
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    gc.unfreeze()  # (the suite freezes its own heap: conftest) measured from nothing frozen
    try:
        with tuned_for_rounds():
            assert gc.get_threshold() == ROUND_THRESHOLDS
            assert gc.get_freeze_count() > 1000  # at least this test's own modules
        assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    finally:
        if frozen:
            gc.freeze()
