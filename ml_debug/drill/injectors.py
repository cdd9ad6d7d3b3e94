"""The drills' fault for `mldebug allreduce-bench --pairwise`: one slow link between two ranks.

Loaded by the bench through its fault hook points (``MLDEBUG_TEST_HOOKS=ml_debug.drill.injectors``,
see :mod:`ml_debug.core.testhooks`) only when `mldebug drill` starts the bench; it reads
``MLDEBUG_DRILL_FAULT=slow-pair:A-B,factor=F``. The bench's result then says that a hook shaped it
(``test_faults``), so a drill's numbers can never pass for a real measurement.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

ENV = "MLDEBUG_DRILL_FAULT"


def slow_pair_spec(a: int, b: int, factor: float) -> str:
    return f"slow-pair:{min(a, b)}-{max(a, b)},factor={factor:g}"


def _slow_pair() -> tuple[tuple[int, int], float] | None:
    text = os.environ.get(ENV, "")
    kind, _, rest = text.partition(":")
    if kind != "slow-pair" or not rest:
        return None
    pair_text, _, factor_text = rest.partition(",factor=")
    a, _, b = pair_text.partition("-")
    try:
        pair = (int(a), int(b))
        return (min(pair), max(pair)), float(factor_text or 3)
    except ValueError:
        return None


def bench_pair_exchange(rank: int, pair: tuple[int, int], elapsed_s: Callable[[], float]) -> None:
    fault = _slow_pair()
    if fault is not None and tuple(sorted(pair)) == fault[0] and fault[1] > 1.0:
        time.sleep(elapsed_s() * (fault[1] - 1.0))  # the exchange takes factor x as long, as on a bad link


def describe(command: str) -> str | None:
    if command == "allreduce-bench" and _slow_pair() is not None:
        return f"mldebug drill: {os.environ.get(ENV)}"
    return None
