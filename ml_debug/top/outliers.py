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

import statistics
from collections.abc import Sequence
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
    nums = [v for _, v in values]
    if len(nums) < min_peers:
        return []
    med = statistics.median(nums)
    mad = statistics.median(abs(v - med) for v in nums)
    out = []
    for key, v in values:
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
        out.append(Far(key, v, med, None if med == 0 else v / med, zscore, len(nums), diff > 0))
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


def find_outliers(nodes: Sequence[dict[str, Any]], rules: Rules = RULES) -> list[dict[str, Any]]:
    """Every outlier among the answering nodes of a snapshot (see the module docstring)."""
    live = [n for n in nodes if n["status"] == "ok"]
    out: list[dict[str, Any]] = []
    ranks = [(n, r) for n in live for r in n["ranks"]]

    cpu = [((n, r), float(r["cpu_pct"])) for n, r in ranks if r.get("cpu_pct") is not None]
    for f in far_from_median(cpu, floor=rules.cpu_floor, ratio=rules.ratio, z=rules.z, min_peers=rules.min_peers):
        n, r = f.key
        what = "busier" if f.high else "idler"
        out.append(_entry("rank_cpu", n, f"{_rank_name(n, r)}: CPU {f.value:.0f}% vs median {f.median:.0f}% of "
                                         f"{f.peers} ranks ({_times(f)}, {what} than its peers)", rank=r, far=f))

    rates = [((n, r), float(r["progress"]["rate"])) for n, r in ranks
             if r.get("progress") and r["progress"].get("rate") is not None]
    for f in far_from_median(rates, floor=0.0, ratio=rules.rate_ratio, z=rules.z, min_peers=rules.min_peers,
                             high=False):
        n, r = f.key
        if f.median <= 0:
            continue
        how = "no progress while its peers move" if f.value == 0 else f"{_times(f)}: slower than its peers"
        out.append(_entry("step_rate", n, f"{_rank_name(n, r)}: {f.value:.2f} steps/s vs median {f.median:.2f} of "
                                          f"{f.peers} ranks ({how})", rank=r, far=f))

    for n, r in ranks:
        state = STATE_WORDS.get(str(r.get("state")))
        if state:
            out.append(_entry(state[0], n, f"{_rank_name(n, r)} is {state[1]}", rank=r, value=r["state"]))

    by_model: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for n in live:
        for g in n["gpus"]:
            by_model.setdefault(str(g.get("name")), []).append((n, g))
    for gpus in by_model.values():
        util = [((n, g), float(g["util_pct"])) for n, g in gpus if g.get("util_pct") is not None]
        for f in far_from_median(util, floor=rules.util_floor, ratio=rules.ratio, z=rules.z,
                                 min_peers=rules.min_peers):
            n, g = f.key
            out.append(_entry("gpu_util", n, f"{_gpu_name(n, g)}: {f.value:.0f}% busy vs median {f.median:.0f}% of "
                                             f"{f.peers} GPUs ({_times(f)})", gpu=g, far=f))
        power = [((n, g), float(g["power_pct"])) for n, g in gpus if g.get("power_pct") is not None]
        for f in far_from_median(power, floor=rules.power_floor, ratio=rules.ratio, z=rules.z,
                                 min_peers=rules.min_peers):
            n, g = f.key
            out.append(_entry("gpu_power", n, f"{_gpu_name(n, g)}: power {f.value:.0f}% of its limit vs median "
                                              f"{f.median:.0f}% of {f.peers} GPUs ({_times(f)})", gpu=g, far=f))

    for n in live:
        for g in n["gpus"]:
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

