"""What a person should look at: values far from their peers' median, and states that are bad alone.

Peer rules compare each value with the median of the same value on every peer (every rank of
the job; every GPU of the same model), the way ``mldebug health`` compares identical GPUs. A
value is an outlier when all of these hold:

- it differs from the median by at least a floor in its own unit (so 0.4 % vs 0.1 % CPU is not
  "4x the median"),
- it is at least ``ratio`` times the median, or at most 1/``ratio`` of it,
- its robust z-score ``0.6745 * (x - median) / MAD`` is at least ``z`` (when every other peer has
  the same value, MAD is 0 and this test passes),
- there are at least ``min_peers`` values to compare.

Alone-rules need no peers: a GPU busy at low power (utilisation high, power far below its limit: a
NCCL kernel spinning while it waits for a peer, not computing), a rank process in D state
(uninterruptible sleep: a stuck file system or driver call), stopped (T) or a zombie, and GPU
badges that mean the hardware protects itself (thermal or hardware slowdown), uncorrected ECC
errors and Xid events.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import math
import operator
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ml_debug.sampling.gpus import BADGE_WORDS


@dataclass(frozen=True)
class Rules:
    """Thresholds of the outlier rules (documented in docs/commands/top.md)."""

    ratio: float = 3.0
    rate_ratio: float = 2.0  # step rates: a rank at half the median's speed is already slow
    z: float = 3.5
    min_peers: int = 3
    cpu_floor: float = 25.0  # CPU percentage points
    util_floor: float = 30.0  # GPU utilisation points
    power_floor: float = 20.0  # power, points of % of the limit
    busy_util: float = 80.0  # "busy at low power": utilisation at least this ...
    low_power_pct: float = 30.0  # ... while drawing at most this % of the power limit


RULES = Rules()


@dataclass(frozen=True)
class Far:
    """One value far from its peers' median."""

    key: Any
    value: float
    median: float
    ratio: float | None  # value / median (None when the median is 0)
    z: float | None  # None when MAD is 0
    peers: int
    high: bool


def far_from_median(values: Sequence[tuple[Any, float]], *, floor: float, ratio: float, z: float,
                    min_peers: int, high: bool = True, low: bool = True) -> list[Far]:
    """The values far from the median of all of them (see the module docstring for the rule)."""
    return _far_from_median(list(map(_VALUE, values)), lambda i: values[i][0], floor=floor, ratio=ratio, z=z,
                            min_peers=min_peers, high=high, low=low)


_VALUE = operator.itemgetter(1)
_FEW = 64  # more candidates than this: every value is weighed in turn


def _far_from_median(nums: list[float], key_of: Callable[[int], Any], *, floor: float, ratio: float, z: float,
                     min_peers: int, high: bool = True, low: bool = True) -> list[Far]:
    """far_from_median of the values `nums`, the i-th one's key being key_of(i) (asked only of the outliers)."""
    n = len(nums)
    if n < min_peers:
        return []
    if not n or not all(map(math.isfinite, nums)):  # NaN or infinity: no order to lean on, each value is weighed
        med = statistics.median(nums)
        return _far(nums, key_of, range(n), med, statistics.median([abs(v - med) for v in nums]), floor=floor,
                    ratio=ratio, z=z, high=high, low=low)
    # Only a value beyond bounds that every outlier passes can be one: those are found in the sorted values
    # (16k ranks: a handful instead of a Python step per value), then weighed by the rule itself. The bounds
    # are halfway to what the rule asks (the floor, the ratio), far from any rounding of the rule's tests.
    ordered = sorted(nums)
    half = n // 2
    med = ordered[half] if n % 2 else (ordered[half - 1] + ordered[half]) / 2  # as statistics.median
    above = bisect.bisect_right(ordered, med) if high else n
    below = bisect.bisect_left(ordered, med) if low else 0
    up = max(floor, (ratio - 1) * med if med > 0 and ratio > 1 else 0.0) / 2
    if up > 0:
        above = max(above, bisect.bisect_left(ordered, med + up))
    down = max(floor, med - med / ratio if med > 0 and ratio > 1 else 0.0) / 2
    if down > 0:
        below = min(below, bisect.bisect_right(ordered, med - down))
    where: Sequence[int] = range(n)
    if below + n - above <= _FEW:
        where = _places(nums, {*ordered[:below], *ordered[above:]})
        if not where:
            return []
    # the MAD, from the sorted values: those below the median and those above, each already in order
    left = bisect.bisect_left(ordered, med)
    spread = [*map(operator.sub, itertools.repeat(med, left), ordered[:left]),
              *map(operator.sub, ordered[left:], itertools.repeat(med, n - left))]
    return _far(nums, key_of, where, med, statistics.median(spread), floor=floor, ratio=ratio, z=z, high=high,
                low=low)


def _places(items: list[Any], wanted: Iterable[Any]) -> list[int]:
    """The places of the items equal to one of `wanted`, in order (list.index: found at C speed)."""
    found: set[int] = set()
    for v in wanted:
        i = -1
        with contextlib.suppress(ValueError):
            while True:
                i = items.index(v, i + 1)
                found.add(i)
    return sorted(found)


def _far(nums: list[float], key_of: Callable[[int], Any], where: Iterable[int], med: float, mad: float, *,
         floor: float, ratio: float, z: float, high: bool, low: bool) -> list[Far]:
    """The rule, for the values at the places `where` (in order)."""
    out = []
    for i in where:
        v = nums[i]
        diff = v - med
        # a value at the median is never far from it (with a floor of 0, step rates: a synchronous job's
        # ranks all step at the same rate, and each was reported "1.00x: slower than its peers")
        if diff == 0 or abs(diff) < floor or (diff > 0 and not high) or (diff < 0 and not low):
            continue
        if diff > 0 and med > 0 and v < ratio * med:
            continue
        if diff < 0 and v * ratio > med:
            continue
        zscore = None if mad == 0 else 0.6745 * diff / mad
        if zscore is not None and abs(zscore) < z:
            continue
        out.append(Far(key_of(i), v, med, None if med == 0 else v / med, zscore, len(nums), diff > 0))
    return out


def _rank_name(node: dict[str, Any], r: dict[str, Any]) -> str:
    return f"{r['label']} ({node['host'] or node['target']}, pid {r['pid']})"


def _gpu_name(node: dict[str, Any], g: dict[str, Any]) -> str:
    return f"GPU {g['index']} of {node['host'] or node['target']}"


def _entry(kind: str, node: dict[str, Any], message: str, *, rank: dict[str, Any] | None = None,
           gpu: dict[str, Any] | None = None, far: Far | None = None, value: Any = None) -> dict[str, Any]:
    return {
        "kind": kind, "node": node["target"], "host": node["host"],
        "rank": rank["rank"] if rank else None, "pid": rank["pid"] if rank else None,
        "gpu": gpu["index"] if gpu else None,
        "value": round(far.value, 3) if far else value,
        "median": round(far.median, 3) if far else None,
        "ratio": None if far is None or far.ratio is None else round(far.ratio, 2),
        "z": None if far is None or far.z is None else round(far.z, 1),
        "peers": far.peers if far else None,
        "message": message,
    }


def _times(f: Far) -> str:
    if f.ratio is None:
        return "its peers at 0"
    return f"x{f.ratio:.0f}" if f.ratio >= 10 or f.ratio == 0 else f"x{f.ratio:.1f}"


KIND_WORDS = {
    "rank_cpu": "cpu", "step_rate": "slow", "d_state": "D-state", "stopped": "stopped", "zombie": "zombie",
    "gpu_util": "util", "gpu_power": "power", "busy_low_power": "busy-low-power",
    "throttle": "throttle", "ecc": "ecc", "xid": "xid",
}
"""The short word the views put in a row's FLAGS column for each kind of outlier."""

SEVERE = frozenset({"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"})
"""The clock-event reasons that mean the hardware protects itself: outliers, not only badges."""


STATE_WORDS = {
    "D": ("d_state", "in D state (uninterruptible sleep: a stuck file system, device or driver call)"),
    "T": ("stopped", "stopped (SIGSTOP, or a debugger holds it)"),
    "Z": ("zombie", "a zombie (it exited; its parent has not reaped it)"),
}


def _columns(items: list[dict[str, Any]], keys: tuple[str, ...]) -> list[list[Any]]:
    """[items[i].get(key) for every i] for each key, in one pass over the items (16k of them, scattered in
    memory: each visit costs a cache miss, the values once there are cheap), at C speed."""
    try:
        rows = list(map(operator.itemgetter(*keys), items))
    except KeyError:  # a partial document: every key, item by item
        rows = [tuple(x.get(k) for k in keys) for x in items]
    if not rows:
        return [[] for _ in keys]
    return [list(c) for c in zip(*rows, strict=True)]


def _present(raw: list[Any], items: list[dict[str, Any]],
             owners: list[dict[str, Any]]) -> tuple[list[float], Callable[[int], tuple[dict[str, Any], Any]]]:
    """The values of `raw` that are there (as floats), and the (node, item) of the i-th of them."""
    if None not in raw:
        return list(map(float, raw)), lambda i: (owners[i], items[i])
    at = [i for i, v in enumerate(raw) if v is not None]
    return [float(raw[i]) for i in at], lambda i: (owners[at[i]], items[at[i]])


def find_outliers(nodes: Sequence[dict[str, Any]], rules: Rules = RULES) -> list[dict[str, Any]]:
    """Every outlier among the answering nodes of a snapshot (see the module docstring)."""
    # 2,048 nodes: 16k ranks and 16k GPUs a round. The values every rule needs are read in one pass over the
    # ranks and one over the GPUs; each rule's common case, nothing to report, is then a C-level scan of a
    # list. The outliers are listed in the rules' order.
    live = [n for n in nodes if n["status"] == "ok"]
    out: list[dict[str, Any]] = []
    ranks: list[dict[str, Any]] = []
    rank_nodes: list[dict[str, Any]] = []
    gpus: list[dict[str, Any]] = []
    gpu_nodes: list[dict[str, Any]] = []
    for n in live:
        rs, gs = n["ranks"], n["gpus"]
        ranks += rs
        rank_nodes += [n] * len(rs)
        gpus += gs
        gpu_nodes += [n] * len(gs)

    cpu_raw, files, state_raw = _columns(ranks, ("cpu_pct", "progress", "state"))
    cpu, key_of = _present(cpu_raw, ranks, rank_nodes)
    for f in _far_from_median(cpu, key_of, floor=rules.cpu_floor, ratio=rules.ratio, z=rules.z,
                              min_peers=rules.min_peers):
        n, r = f.key
        what = "busier" if f.high else "idler"
        out.append(_entry("rank_cpu", n, f"{_rank_name(n, r)}: CPU {f.value:.0f}% vs median {f.median:.0f}% of "
                                         f"{f.peers} ranks ({_times(f)}, {what} than its peers)", rank=r, far=f))

    rates, key_of = _present([p.get("rate") if p else None for p in files], ranks, rank_nodes)
    for f in _far_from_median(rates, key_of, floor=0.0, ratio=rules.rate_ratio, z=rules.z,
                              min_peers=rules.min_peers, high=False):
        n, r = f.key
        if f.median <= 0:
            continue
        how = "no progress while its peers move" if f.value == 0 else f"{_times(f)}: slower than its peers"
        out.append(_entry("step_rate", n, f"{_rank_name(n, r)}: {f.value:.2f} steps/s vs median {f.median:.2f} of "
                                          f"{f.peers} ranks ({how})", rank=r, far=f))

    states = list(map(str, state_raw))
    if not STATE_WORDS.keys().isdisjoint(states):
        for i, word in enumerate(states):
            state = STATE_WORDS.get(word)
            if state:
                n, r = rank_nodes[i], ranks[i]
                out.append(_entry(state[0], n, f"{_rank_name(n, r)} is {state[1]}", rank=r, value=r["state"]))

    names, utils, powers, throttles, eccs, xids = _columns(
        gpus, ("name", "util_pct", "power_pct", "throttle", "ecc_uncorrected", "xid"))
    # peers: the GPUs of the same model, each model in the order first seen
    models = list(map(str, names))
    groups: list[tuple[list[dict[str, Any]], list[dict[str, Any]], list[Any], list[Any]]] = []
    if len(set(models)) == 1:  # one model (the common case): the lists as they are
        groups.append((gpus, gpu_nodes, utils, powers))
    else:
        members: dict[str, list[int]] = {m: [] for m in models}
        for i, m in enumerate(models):
            members[m].append(i)
        groups += [([gpus[i] for i in at], [gpu_nodes[i] for i in at], [utils[i] for i in at],
                    [powers[i] for i in at]) for at in members.values()]
    for same, owners, util_raw, power_raw in groups:
        for kind, raw, floor, what in (("gpu_util", util_raw, rules.util_floor, "{:.0f}% busy"),
                                       ("gpu_power", power_raw, rules.power_floor, "power {:.0f}% of its limit")):
            nums, key_of = _present(raw, same, owners)
            for f in _far_from_median(nums, key_of, floor=floor, ratio=rules.ratio, z=rules.z,
                                      min_peers=rules.min_peers):
                n, g = f.key
                out.append(_entry(kind, n, f"{_gpu_name(n, g)}: {what.format(f.value)} vs median {f.median:.0f}% of "
                                           f"{f.peers} GPUs ({_times(f)})", gpu=g, far=f))

    # alone: the GPUs a rule may flag (found by scans of the lists), each GPU's outliers in the rules' order
    flagged: set[int] = set()
    busy = [i for i, u in enumerate(utils) if u is not None and u >= rules.busy_util]
    flagged.update(i for i in busy if powers[i] is not None and powers[i] <= rules.low_power_pct)
    for values in (throttles, eccs, xids):
        if any(values):
            flagged.update(i for i, v in enumerate(values) if v)
    for i in sorted(flagged):
        n, g = gpu_nodes[i], gpus[i]
        util, power = g.get("util_pct"), g.get("power_pct")
        if util is not None and power is not None and util >= rules.busy_util and power <= rules.low_power_pct:
            out.append(_entry("busy_low_power", n, f"{_gpu_name(n, g)}: {util:.0f}% busy at {power:.0f}% of its "
                                                   "power limit (a NCCL kernel spinning while it waits for a "
                                                   "peer, not computing)", gpu=g, value=util))
        severe = [BADGE_WORDS[t] for t in g.get("throttle") or [] if t in SEVERE]
        if severe:
            out.append(_entry("throttle", n, f"{_gpu_name(n, g)}: clocks held down ({', '.join(severe)})",
                              gpu=g, value=severe))
        if g.get("ecc_uncorrected"):
            out.append(_entry("ecc", n, f"{_gpu_name(n, g)}: {g['ecc_uncorrected']} uncorrected ECC error(s) "
                                        "since the driver loaded", gpu=g, value=g["ecc_uncorrected"]))
        if g.get("xid"):
            out.append(_entry("xid", n, f"{_gpu_name(n, g)}: Xid {', '.join(map(str, g['xid']))} in the kernel "
                                        "log (mldebug health explains them)", gpu=g, value=g["xid"]))
    return out
