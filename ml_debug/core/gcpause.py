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
