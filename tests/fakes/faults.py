"""TEST-ONLY faults for `mldebug gpu-test` and `mldebug allreduce-bench`: one grammar, one env var.

Loaded by the product only through ``MLDEBUG_TEST_HOOKS=tests.fakes.faults`` (see
``ml_debug.core.testhooks``); it reads ``MLDEBUG_TEST_FAULT``, a ``;``-separated list of
``<command>.<kind>[:key=value[,key=value...]]``. Each fault names the command it acts on, so one
value can drive a whole ``mldebug check`` and a fault for one command never disturbs another:

``gpu-test.wrong-value[:rank=R][,device=D]``
    contribute rank+1+1000 to the all_reduce instead of rank+1;
``gpu-test.die[:rank=R][,device=D][,stage=S]``
    SIGKILL itself when stage S starts (default all_reduce);
``gpu-test.hang[:rank=R][,device=D][,stage=S]``
    stall when stage S starts (gpu-test's own watchdog ends it);
``allreduce-bench.corrupt:rank=R[,count=N]``
    after each verification collective, rank R overwrites N (default 3) received elements, as a
    flaky link or bad memory would;
``allreduce-bench.slow:rank=R[,factor=F]``
    rank R stays F (default 3) times as long in each timed batch of the sweep, as a straggler would;
``allreduce-bench.slow-pair:pair=A-B[,factor=F][,remeasures=N]``
    in ``--pairwise``, the exchange between units A and B (ranks, or nodes when there are several)
    takes F (default 3) times as long: in the first measurement and, with ``remeasures``, only in the
    first N rounds of re-measuring (0: a transient that the first re-measurement no longer sees).

A gpu-test fault without rank or device acts on every rank; ``device`` is the device (or
``--isolate`` member) index the rank runs on.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ml_debug.core.errors import UsageError
from ml_debug.gputest.verdict import STAGES
from tests.fakes import hooks_env

ENV = "MLDEBUG_TEST_FAULT"
GPU_TEST, BENCH = "gpu-test", "allreduce-bench"

# (command, kind) -> (keys it accepts, keys it needs)
KINDS: dict[tuple[str, str], tuple[frozenset[str], frozenset[str]]] = {
    (GPU_TEST, "wrong-value"): (frozenset({"rank", "device"}), frozenset()),
    (GPU_TEST, "die"): (frozenset({"rank", "device", "stage"}), frozenset()),
    (GPU_TEST, "hang"): (frozenset({"rank", "device", "stage"}), frozenset()),
    (BENCH, "corrupt"): (frozenset({"rank", "count"}), frozenset({"rank"})),
    (BENCH, "slow"): (frozenset({"rank", "factor"}), frozenset({"rank"})),
    (BENCH, "slow-pair"): (frozenset({"pair", "factor", "remeasures"}), frozenset({"pair"})),
}
GRAMMAR = ("<command>.<kind>[:key=value,...], ';' between faults: gpu-test.wrong-value|die|hang"
           "[:rank=R][,device=D][,stage=S]; allreduce-bench.corrupt:rank=R[,count=N]; "
           "allreduce-bench.slow:rank=R[,factor=F]; allreduce-bench.slow-pair:pair=A-B[,factor=F][,remeasures=N]")


@dataclass(frozen=True)
class Fault:
    """One parsed fault; ``text`` is its entry as written, for the run's notes."""

    command: str
    kind: str
    text: str
    rank: int | None = None
    device: int | None = None
    stage: str = "all_reduce"
    count: int = 3
    factor: float = 3.0
    pair: tuple[int, int] | None = None
    remeasures: int | None = None  # slow-pair: slow in this many re-measuring rounds too (None: in all)

    def applies(self, rank: int, device: int | None = None) -> bool:
        """Does this fault target that rank (and, for gpu-test, that device)?"""
        if self.rank is not None and self.rank != rank:
            return False
        return self.device is None or self.device == device


def _bad(entry: str, why: str) -> UsageError:
    return UsageError(f"{ENV}: bad fault {entry!r}: {why}", f"test-only hook; grammar: {GRAMMAR}")


def _parse_one(entry: str) -> Fault:
    head, _, rest = entry.partition(":")
    command, dot, kind = head.strip().rpartition(".")
    if not dot:
        raise _bad(entry, f"no command before the kind (e.g. {GPU_TEST}.{kind} or {BENCH}.{kind})")
    if (command, kind) not in KINDS:
        known = ", ".join(f"{c}.{k}" for c, k in KINDS)
        raise _bad(entry, f"unknown fault {command}.{kind} (known: {known})")
    accepted, needed = KINDS[(command, kind)]
    params: dict[str, str] = {}
    for kv in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = kv.partition("=")
        key = key.strip()
        if not sep or key not in accepted:
            raise _bad(entry, f"{kv!r} is not one of {', '.join(sorted(accepted))} as key=value")
        params[key] = value.strip()
    if needed - params.keys():
        raise _bad(entry, f"needs {', '.join(sorted(needed - params.keys()))}")
    fields: dict[str, Any] = {}
    try:
        for key in ("rank", "device", "count", "remeasures"):
            if key in params:
                fields[key] = int(params[key])
        if "factor" in params:
            fields["factor"] = float(params["factor"])
        if "pair" in params:
            a, b = (int(x) for x in params["pair"].split("-"))
            fields["pair"] = (min(a, b), max(a, b))
    except ValueError:
        raise _bad(entry, "rank, device, count and remeasures are integers, factor a number, pair A-B") from None
    if "stage" in params:
        if params["stage"] not in STAGES:
            raise _bad(entry, f"stage is one of {', '.join(STAGES)}")
        fields["stage"] = params["stage"]
    return Fault(command, kind, entry, **fields)


@functools.lru_cache(maxsize=8)
def parse(spec: str | None) -> tuple[Fault, ...]:
    """Every fault of a ``MLDEBUG_TEST_FAULT`` value; UsageError on anything malformed."""
    return tuple(_parse_one(e.strip()) for e in (spec or "").split(";") if e.strip())


def active(command: str) -> tuple[Fault, ...]:
    """The faults of ``MLDEBUG_TEST_FAULT`` that act on ``command``."""
    return tuple(f for f in parse(os.environ.get(ENV, "")) if f.command == command)


def env(spec: str) -> dict[str, str]:
    """Environment that makes a ``mldebug`` subprocess (and its ranks) inject the faults in ``spec``."""
    return hooks_env(__name__, {ENV: spec})


# ---- the hook points (ml_debug.core.testhooks calls them by name) ---------------------------------

def describe(command: str) -> str | None:
    return ";".join(f.text for f in active(command)) or None


def gpu_test_stage_start(rank: int, device: int | None, stage: str) -> None:
    for f in active(GPU_TEST):
        if f.kind in ("die", "hang") and f.stage == stage and f.applies(rank, device):
            if f.kind == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            # A stalled rank on purpose: gpu-test's watchdog is what ends this process.
            while True:
                time.sleep(3600)


def gpu_test_contribution(rank: int, device: int | None, value: float) -> float | None:
    if any(f.kind == "wrong-value" and f.applies(rank, device) for f in active(GPU_TEST)):
        return value + 1000.0
    return None


def bench_timed_region(rank: int, collective: str, size: int, elapsed_s: Callable[[], float]) -> None:
    for f in active(BENCH):
        if f.kind == "slow" and f.rank == rank and f.factor > 1.0:
            time.sleep(elapsed_s() * (f.factor - 1.0))


def bench_pair_exchange(rank: int, pair: tuple[int, int], elapsed_s: Callable[[], float], remeasure: int = 0) -> None:
    for f in active(BENCH):
        lasts = f.remeasures is None or remeasure <= f.remeasures
        if f.kind == "slow-pair" and f.pair == tuple(sorted(pair)) and f.factor > 1.0 and lasts:
            time.sleep(elapsed_s() * (f.factor - 1.0))


def bench_verify_result(rank: int, collective: str, result: Any, expected: Callable[[int, int], Any]) -> None:
    import torch

    for f in active(BENCH):
        total = result.numel() if f.kind == "corrupt" and f.rank == rank else 0
        if f.count <= 0 or not total:
            continue
        positions = torch.linspace(0, total - 1, steps=min(f.count, total), device=result.device).long().unique()
        for p in positions.tolist():
            result[p] = -expected(p, p + 1)[0] - 1  # never equal to the expected (integral) value
