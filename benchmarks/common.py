"""Small helpers shared by the benchmark scripts: one Result line per measurement."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Result:
    """One benchmark line: a ratio measured side by side in one run, and what it compares."""

    name: str
    ratio: float
    detail: str

    def line(self) -> str:
        return f"{self.name:<44} ratio {self.ratio:8.3f}   {self.detail}"


def timeit(fn: Callable[[], object], repeat: int = 5, warmup: int = 1) -> float:
    """Median wall time of `fn` in seconds over `repeat` runs (after `warmup` runs)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)
