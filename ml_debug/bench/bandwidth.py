"""Bandwidth maths with nccl-tests' definitions, size parsing and sweeps. Pure: no torch.

Definitions (nccl-tests' doc/PERFORMANCE.md; GB = 1e9 bytes, sizes in binary K/M/G):

* ``S`` is the size column of the table: the bytes of the largest buffer one rank touches,
  all_reduce/broadcast/reduce/sendrecv: ``count * elem``; all_gather/reduce_scatter: the full
  (gathered / scattered-from) buffer ``per_rank_count * elem * n``; all_to_all: one rank's send buffer.
* ``algbw = S / t`` and ``busbw = algbw * factor``; factor: all_reduce ``2(n-1)/n``;
  all_gather, reduce_scatter, all_to_all ``(n-1)/n``; broadcast, reduce, sendrecv ``1``.
* ``t`` is the mean time of one operation over the timed iterations, averaged across ranks
  (nccl-tests' default ``-a 1``); ``max``/``min``/``rank0`` are its other choices.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ml_debug.core.errors import UsageError

COLLECTIVES: tuple[str, ...] = (
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "sendrecv",
)
# Collectives whose result depends on --op.
REDUCING: frozenset[str] = frozenset({"all_reduce", "reduce", "reduce_scatter"})
# Collectives with a root rank.
ROOTED: frozenset[str] = frozenset({"broadcast", "reduce"})
# Per-rank buffers are blocks of count/n: S must split evenly across ranks.
BLOCKED: frozenset[str] = frozenset({"all_gather", "reduce_scatter", "all_to_all"})

_COLLECTIVE_ALIASES = {
    "allreduce": "all_reduce", "ar": "all_reduce",
    "allgather": "all_gather", "ag": "all_gather",
    "reducescatter": "reduce_scatter", "rs": "reduce_scatter",
    "bcast": "broadcast",
    "alltoall": "all_to_all", "a2a": "all_to_all",
    "p2p": "sendrecv", "send_recv": "sendrecv", "ring": "sendrecv",
}

# name -> (canonical torch dtype name, bytes per element, mantissa bits (None for integers))
DTYPES: dict[str, tuple[str, int, int | None]] = {
    "float32": ("float32", 4, 23),
    "float16": ("float16", 2, 10),
    "bfloat16": ("bfloat16", 2, 7),
    "float64": ("float64", 8, 52),
    "int32": ("int32", 4, None),
    "int64": ("int64", 8, None),
    "int8": ("int8", 1, None),
    "uint8": ("uint8", 1, None),
}
_DTYPE_ALIASES = {
    "float": "float32", "fp32": "float32", "f32": "float32",
    "half": "float16", "fp16": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "double": "float64", "fp64": "float64", "f64": "float64",
    "int": "int32", "i32": "int32", "long": "int64", "i64": "int64",
    "i8": "int8", "u8": "uint8", "char": "int8", "byte": "uint8",
}
OPS: tuple[str, ...] = ("sum", "prod", "max", "min", "avg")
AVERAGES: tuple[str, ...] = ("avg", "max", "min", "rank0")

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtKMGT]?)(i?[bB])?\s*$")


def bus_factor(collective: str, n: int) -> float:
    """busbw / algbw for `collective` on `n` ranks (nccl-tests' factors)."""
    if n < 1:
        raise ValueError(f"world size must be >= 1, got {n}")
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes): S / t."""
    if seconds <= 0:
        return math.inf
    return size_bytes / seconds / 1e9


def busbw_gbps(collective: str, size_bytes: int, seconds: float, n: int) -> float:
    """Bus bandwidth in GB/s: algbw times the collective's factor, comparable with link speed."""
    return algbw_gbps(size_bytes, seconds) * bus_factor(collective, n)


@dataclass(frozen=True)
class Layout:
    """Buffers one rank uses for one sweep size (element counts) and the S that is reported."""

    collective: str
    n: int
    elem_size: int
    count: int  # elements in the S buffer (nccl-tests' count column)
    in_count: int
    out_count: int  # 0 when the collective works in place

    @property
    def size_bytes(self) -> int:
        return self.count * self.elem_size

    @property
    def block(self) -> int:
        """Elements per rank block (all_gather / reduce_scatter / all_to_all), else count."""
        return self.count // self.n if self.collective in BLOCKED else self.count

    @property
    def footprint_bytes(self) -> int:
        """Bytes of buffers this rank holds for the timing pass."""
        return (self.in_count + self.out_count) * self.elem_size


def layout(collective: str, size_bytes: int, elem_size: int, n: int) -> Layout:
    """Element counts for a requested size, rounded down like nccl-tests (at least one per rank).

    >>> layout("all_gather", 1024, 4, 4).count, layout("all_gather", 1024, 4, 4).in_count
    (256, 64)
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}")
    count = max(1, size_bytes // elem_size)
    if collective in BLOCKED:
        per = max(1, count // n)
        count = per * n
        if collective == "all_gather":
            return Layout(collective, n, elem_size, count, per, count)
        if collective == "reduce_scatter":
            return Layout(collective, n, elem_size, count, count, per)
        return Layout(collective, n, elem_size, count, count, count)  # all_to_all
    if collective == "sendrecv":
        return Layout(collective, n, elem_size, count, count, count)
    return Layout(collective, n, elem_size, count, count, 0)  # in place


def parse_size(text: str | int, what: str = "size") -> int:
    """'64M' -> 67108864. Binary K/M/G/T suffixes as nccl-tests (an optional B or iB is accepted)."""
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE_RE.match(str(text))
        if not m:
            raise UsageError(f"bad {what} {text!r}: expected a number with an optional K, M, G or T suffix",
                             "sizes are bytes in binary units, e.g. 8, 1K, 64M, 1.5G")
        value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value < 1:
        raise UsageError(f"bad {what} {text!r}: must be at least 1 byte", "e.g. -b 8 -e 64M")
    return value


def format_size(n_bytes: float) -> str:
    """1048576 -> '1M' (binary units, as nccl-tests' size arguments)."""
    for unit in ("T", "G", "M", "K"):
        scale = _UNITS[unit]
        if n_bytes >= scale and n_bytes % scale == 0:
            return f"{int(n_bytes // scale)}{unit}"
    for unit in ("T", "G", "M", "K"):
        if n_bytes >= _UNITS[unit]:
            return f"{n_bytes / _UNITS[unit]:.1f}{unit}"
    return f"{int(n_bytes)}"


def parse_factor(text: str | float) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise UsageError(f"bad step factor {text!r}: expected a number > 1", "e.g. -f 2") from None
    if not math.isfinite(value) or value <= 1:
        raise UsageError(f"bad step factor {text!r}: must be > 1", "e.g. -f 2 doubles the size each step")
    return value


def sweep(min_bytes: int, max_bytes: int, factor: float = 2.0) -> list[int]:
    """Sizes min, min*f, min*f^2 ... up to max inclusive (nccl-tests' -b/-e/-f)."""
    if min_bytes > max_bytes:
        raise UsageError(f"min size {format_size(min_bytes)} is larger than max size {format_size(max_bytes)}",
                         "swap -b/--min-bytes and -e/--max-bytes")
    if factor <= 1:
        raise UsageError(f"bad step factor {factor}: must be > 1", "e.g. -f 2")
    sizes: list[int] = []
    size = float(min_bytes)
    while size <= max_bytes * (1 + 1e-12):
        value = int(round(size))
        if not sizes or value != sizes[-1]:
            sizes.append(value)
        size *= factor
    return sizes


def cap_sizes(sizes: Sequence[int], limit_bytes: int) -> tuple[list[int], list[int]]:
    """(kept, dropped): sizes above `limit_bytes` are dropped; when none fits, the largest power
    of two that does is measured instead, so there is always something to report."""
    kept = [s for s in sizes if s <= limit_bytes]
    dropped = [s for s in sizes if s > limit_bytes]
    if not kept and sizes:
        kept = [1 << max(0, int(limit_bytes).bit_length() - 1)]
    return kept, dropped


def parse_dtype(text: str) -> str:
    """Canonical dtype name ('bf16' -> 'bfloat16'); UsageError for unknown ones."""
    key = text.strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise UsageError(f"unknown dtype {text!r}", f"choose one of: {', '.join(DTYPES)}")
    return key


def elem_size(dtype: str) -> int:
    return DTYPES[parse_dtype(dtype)][1]


def parse_op(text: str) -> str:
    key = text.strip().lower()
    if key not in OPS:
        raise UsageError(f"unknown reduction op {text!r}", f"choose one of: {', '.join(OPS)}")
    return key


def parse_collectives(text: str) -> list[str]:
    """'all_reduce,all_gather' or 'all' -> canonical names, in order, without repeats."""
    names: list[str] = []
    for part in text.split(","):
        key = part.strip().lower().replace("-", "_")
        if not key:
            continue
        if key == "all":
            wanted = list(COLLECTIVES)
        else:
            key = _COLLECTIVE_ALIASES.get(key.replace("_", ""), _COLLECTIVE_ALIASES.get(key, key))
            if key not in COLLECTIVES:
                raise UsageError(f"unknown collective {part.strip()!r}",
                                 f"choose from: {', '.join(COLLECTIVES)} (comma-separated) or all")
            wanted = [key]
        names.extend(w for w in wanted if w not in names)
    if not names:
        raise UsageError("no collective given", f"choose from: {', '.join(COLLECTIVES)} or all")
    return names


def across_ranks(rank_times: Sequence[float], how: str = "avg") -> float:
    """Combine per-rank mean times like nccl-tests' -a: avg (default), max, min, rank0."""
    if not rank_times:
        raise ValueError("no rank times")
    if how == "avg":
        return sum(rank_times) / len(rank_times)
    if how == "max":
        return max(rank_times)
    if how == "min":
        return min(rank_times)
    if how == "rank0":
        return rank_times[0]
    raise ValueError(f"unknown average {how!r}")


def spread(rank_times: Sequence[float]) -> float:
    """(slowest - fastest) / fastest: 0 when every rank took the same time."""
    lo, hi = min(rank_times), max(rank_times)
    return (hi - lo) / lo if lo > 0 else 0.0


def slow_outlier(rank_times: Sequence[float], threshold: float) -> int | None:
    """The rank whose time exceeds the median of the others by more than `threshold` (0.5 = 50%)."""
    if len(rank_times) < 2:
        return None
    worst = max(range(len(rank_times)), key=lambda r: rank_times[r])
    others = [t for r, t in enumerate(rank_times) if r != worst]
    ref = statistics.median(others)
    if ref > 0 and rank_times[worst] > ref * (1 + threshold):
        return worst
    return None


def large_sizes(sizes: Sequence[int], fraction: float = 1 / 8) -> list[int]:
    """The sizes that count as 'large' for the footer average: >= largest * fraction."""
    if not sizes:
        return []
    top = max(sizes)
    return [s for s in sizes if s >= top * fraction]


def round_robin(units: int) -> list[list[tuple[int, int]]]:
    """Circle-method schedule: every pair once, disjoint pairs per round (units-1 or units rounds)."""
    if units < 2:
        return []
    slots: list[int | None] = list(range(units))
    if units % 2:
        slots.append(None)  # a bye
    m = len(slots)
    rounds: list[list[tuple[int, int]]] = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = slots[i], slots[m - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        slots = [slots[0], slots[-1], *slots[1:-1]]  # keep the first, rotate the rest
    return rounds


Pair = tuple[int, int]


@dataclass(frozen=True)
class SlowFindings:
    median: float  # of every link
    slow_links: list[Pair]
    slow_units: list[int]
    unit_scores: list[float]
    others: dict[Pair, float]  # each link -> the median of the other links (its floor: less the threshold)


def _median_without(ordered: Sequence[float], i: int) -> float:
    """The median of the sorted values ``ordered`` without the one at index ``i``."""
    rest = len(ordered) - 1

    def at(j: int) -> float:
        return ordered[j if j < i else j + 1]

    return at(rest // 2) if rest % 2 else (at(rest // 2 - 1) + at(rest // 2)) / 2


def find_slow(matrix: Sequence[Sequence[float | None]], threshold: float) -> SlowFindings:
    """Links below the median of the other links by more than `threshold`, and units whose median link is.

    Each link is held against the others, as a straggler rank is: with few units one link that
    contention held down would otherwise pull the median, and the floor, under a slow link. A unit
    (rank or node) is named when the median of its own links is low: one bad link names only the
    link, a bad node drags all its links down and is named itself.
    """
    n = len(matrix)
    links: dict[Pair, float] = {}
    for a in range(n):
        for b in range(a + 1, n):
            value = matrix[a][b]
            if value is not None:
                links[(a, b)] = value
    if not links:
        return SlowFindings(0.0, [], [], [], {})
    ranked = sorted(links, key=links.__getitem__)
    ordered = [links[p] for p in ranked]
    others = ({p: _median_without(ordered, i) for i, p in enumerate(ranked)} if len(ranked) > 1
              else {})  # one link has nothing to be held against
    slow_links = sorted(p for p, med in others.items() if links[p] < med * (1 - threshold))
    scores = []
    for u in range(n):
        mine = [v for (a, b), v in links.items() if u in (a, b)]
        scores.append(statistics.median(mine) if mine else math.nan)
    valid = [s for s in scores if not math.isnan(s)]
    unit_med = statistics.median(valid) if valid else 0.0
    slow_units = [u for u, s in enumerate(scores) if not math.isnan(s) and s < unit_med * (1 - threshold)]
    if n == 2:
        slow_units = []  # with two units there is nothing to compare a unit with
    return SlowFindings(statistics.median(ordered), slow_links, slow_units, scores, others)


@dataclass(frozen=True)
class Confirmed:
    """What :func:`confirm_slow` found: the verdict on the final matrix and every re-measurement."""

    findings: SlowFindings  # on `matrix`: every link it names was re-measured and stayed below the floor
    matrix: list[list[float | None]]  # each pair's best figure, re-measurements included
    again: dict[Pair, list[float]]  # the pairs re-measured -> each re-measurement's figure, in order


def confirm_slow(matrix: Sequence[Sequence[float | None]], threshold: float,
                 remeasure: Callable[[list[Pair]], tuple[dict[Pair, float], float]],
                 most: int = 2, budget_s: float = math.inf) -> Confirmed:
    """Name a link slow only when measuring it again confirms it.

    Every link below the floor (``find_slow``) is measured again with ``remeasure(pairs)``, which
    returns each pair's new figure and the seconds that took; a pair keeps its best figure, so one
    re-measurement at or above the floor clears it (a transient), and a link that stays below it
    through ``most`` re-measurements is named. The floors follow the best figures, so a link that
    falls below a floor that rose is measured again too. Once ``budget_s`` is spent,
    only links never re-measured are measured again: every link named was re-measured at least once.
    Pure: the caller's ``remeasure`` does the measuring, and ranks that see the same figures (and
    the same seconds) take the same steps.
    """
    values = [list(row) for row in matrix]
    again: dict[Pair, list[float]] = {}
    spent = 0.0
    while True:
        found = find_slow(values, threshold)
        limit = most if spent < budget_s else 1
        todo = [p for p in found.slow_links if len(again.get(p, ())) < limit]
        if not todo:
            return Confirmed(found, values, again)
        fresh, seconds = remeasure(todo)
        spent += seconds
        for a, b in todo:
            figure = fresh[(a, b)]
            again.setdefault((a, b), []).append(figure)
            best = max(values[a][b] or 0.0, figure)  # a NaN figure (never timed) replaces nothing
            values[a][b] = values[b][a] = best


def rounds_holding(schedule: Sequence[Sequence[Pair]], pairs: Sequence[Pair]) -> list[int]:
    """Indices of the rounds of ``schedule`` that hold any of ``pairs``, in schedule order."""
    wanted = set(pairs)
    return [ri for ri, round_pairs in enumerate(schedule) if wanted.intersection(round_pairs)]
