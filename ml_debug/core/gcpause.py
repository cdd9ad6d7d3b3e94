"""Python's cycle collector held off while a large analysis builds its many small objects.

A client that reads a 16k-rank job holds millions of objects (Flight Recorder records, node
samples). CPython starts a full collection whenever the objects that survived since the last one
exceed a quarter of all it holds, and each full collection walks every object again: a step that
allocates as much as the job is large then pays, again and again, for everything already held.
The analyses build acyclic data (dicts, lists, dataclasses), which reference counting frees; the
collector is held off for their duration and restored on the way out.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cycle collection inside the block (restored as it was: nesting and threads are fine)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# A client that takes in every node's sample each round (top, watch over 2,048 nodes: ~1M small objects a
# round, all kept until the next) would otherwise run a young collection every 700 allocations and walk
# its whole start-up heap (rich, typer, paramiko...) in every full one. The samples are acyclic: reference
# counting frees them. 16k ranks, one round's client CPU (`python benchmarks/run.py scale`): top
# 0.73-0.87 -> 0.42-0.45 s, watch 0.76-0.94 -> 0.47-0.49 s.
ROUND_THRESHOLDS = (200_000, 50, 100)


@contextlib.contextmanager
def tuned_for_rounds() -> Iterator[None]:
    """While a sampling client runs: the heap it started with frozen (never walked again) and young
    collections every 200,000 allocations; both restored on the way out."""
    old = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*ROUND_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()
