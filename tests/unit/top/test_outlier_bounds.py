"""top's outlier rule at scale (top/outliers.py): the values weighed are found from the sorted values, and
the result is the rule's, value by value, for every kind of input."""

from __future__ import annotations

import random
import statistics
from typing import Any

from ml_debug.top.verdict import Far, far_from_median


def _rule(values: list[tuple[Any, float]], *, floor: float, ratio: float, z: float, min_peers: int,
          high: bool = True, low: bool = True) -> list[Far]:
    """The rule as the module docstring states it, weighing every value in turn."""
    nums = [v for _, v in values]
    if len(nums) < min_peers:
        return []
    med = statistics.median(nums)
    mad = statistics.median(abs(v - med) for v in nums)
    out = []
    for key, v in values:
        diff = v - med
        if diff == 0 or abs(diff) < floor or (diff > 0 and not high) or (diff < 0 and not low):
            continue
        if diff > 0 and med > 0 and v < ratio * med:
            continue
        if diff < 0 and v * ratio > med:
            continue
        zscore = None if mad == 0 else 0.6745 * diff / mad
        if zscore is not None and abs(zscore) < z:
            continue
        out.append(Far(key, v, med, None if med == 0 else v / med, zscore, len(nums), diff > 0))
    return out


def test_far_from_median_is_the_rule_on_every_kind_of_input() -> None:
    rnd = random.Random(30)
    shapes = [
        lambda n: [2.0] * n,  # lockstep step rates
        lambda n: [rnd.choice([97.0, 98.0, 99.0]) for _ in range(n)],  # busy GPUs
        lambda n: [rnd.gauss(100, 3) for _ in range(n)],
        lambda n: [rnd.uniform(-5, 5) for _ in range(n)],  # a median at or below 0
        lambda n: [rnd.choice([0.0, 0.0, 0.1, 400.0]) for _ in range(n)],
        lambda n: [rnd.randint(0, 3) for _ in range(n)],  # whole numbers
        lambda n: [rnd.expovariate(1.0) for _ in range(n)],
    ]
    checked = 0
    for shape in shapes:
        for n in (0, 1, 2, 3, 4, 7, 50, 300):
            nums = shape(n)
            for _ in range(rnd.randint(0, 3)):  # a few odd values
                if nums:
                    nums[rnd.randrange(n)] = rnd.choice([0.0, 0.4, 3.0, 1e6, -1e6, float("inf"), float("nan")])
            values = [(i, v) for i, v in enumerate(nums)]
            for floor in (0.0, 1.0, 25.0):
                for ratio in (0.5, 1.0, 2.0, 3.0):
                    for high, low in ((True, True), (False, True), (True, False)):
                        kw = {"floor": floor, "ratio": ratio, "z": 3.5, "min_peers": 3, "high": high, "low": low}
                        assert repr(far_from_median(values, **kw)) == repr(_rule(values, **kw)), (nums, kw)
                        checked += 1
    assert checked > 1000


def test_many_far_values_are_each_weighed() -> None:
    values = [(i, 1.0) for i in range(200)] + [(1000 + i, 50.0 + i) for i in range(100)]
    kw: dict[str, Any] = {"floor": 1.0, "ratio": 3.0, "z": 3.5, "min_peers": 3}
    assert [f.key for f in far_from_median(values, **kw)] == [f.key for f in _rule(values, **kw)]
    assert len(far_from_median(values, **kw)) == 100
