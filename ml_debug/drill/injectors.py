"""The drills' fault for `mldebug allreduce-bench --pairwise`: one slow link between two ranks.

Loaded by the bench through its fault hook points (``MLDEBUG_TEST_HOOKS=ml_debug.drill.injectors``,
see :mod:`ml_debug.core.testhooks`) only when `mldebug drill` starts the bench; it reads
``MLDEBUG_DRILL_FAULT=slow-pair:A-B,factor=F[,remeasures=N]``. Without ``remeasures`` the link is slow
whenever it is measured; with it, only in the first measurement and the first N rounds of measuring
again (``remeasures=0``: a transient that the bench's re-measurement must clear). The bench's result
then says that a hook shaped it (``test_faults``), so a drill's numbers can never pass for a real
measurement.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

ENV = "MLDEBUG_DRILL_FAULT"


@dataclass(frozen=True)
class SlowPair:
    pair: tuple[int, int]
    factor: float = 3.0
    remeasures: int | None = None  # slow in this many re-measuring rounds too (None: in every one)

    def slows(self, pair: tuple[int, int], remeasure: int) -> bool:
        lasts = self.remeasures is None or remeasure <= self.remeasures
        return tuple(sorted(pair)) == self.pair and self.factor > 1.0 and lasts


def slow_pair_spec(a: int, b: int, factor: float, remeasures: int | None = None) -> str:
    spec = f"slow-pair:{min(a, b)}-{max(a, b)},factor={factor:g}"
    return spec if remeasures is None else f"{spec},remeasures={remeasures}"


def _slow_pair() -> SlowPair | None:
    text = os.environ.get(ENV, "")
    kind, _, rest = text.partition(":")
    if kind != "slow-pair" or not rest:
        return None
    pair_text, *params = rest.split(",")
    a, _, b = pair_text.partition("-")
    keys = dict(p.partition("=")[::2] for p in params)
    try:
        pair = (int(a), int(b))
        remeasures = keys.pop("remeasures", None)
        fault = SlowPair((min(pair), max(pair)), float(keys.pop("factor", "") or 3),
                         None if remeasures is None else int(remeasures))
    except ValueError:
        return None
    return None if keys else fault


def bench_pair_exchange(rank: int, pair: tuple[int, int], elapsed_s: Callable[[], float], remeasure: int = 0) -> None:
    fault = _slow_pair()
    if fault is not None and fault.slows(pair, remeasure):
        time.sleep(elapsed_s() * (fault.factor - 1.0))  # the exchange takes factor x as long, as on a bad link


def describe(command: str) -> str | None:
    if command == "allreduce-bench" and _slow_pair() is not None:
        return f"mldebug drill: {os.environ.get(ENV)}"
    return None
