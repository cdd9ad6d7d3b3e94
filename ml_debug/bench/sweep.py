"""Collective bandwidth sweep with nccl-tests' rigor: what `mldebug allreduce-bench` runs on each rank.

The shell equivalent is ``all_reduce_perf -b 8 -e 128M -f 2 -g 1`` from nccl-tests under mpirun.

Per size, on every rank: warmup, a barrier, then one timed batch of ``iters`` operations
(perf_counter around a synchronised batch on CPU, CUDA events on GPU; nothing printed, copied to
host or allocated inside). Times are gathered once at the end. After all timing, a separate
verification pass with deterministic per-rank data counts wrong elements per size and rank.
Every rank returns the same :class:`BenchResult`; rank 0 reports it.
"""

from __future__ import annotations

import functools
import gc
import math
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ml_debug.bench import bandwidth as bw
from ml_debug.bench import ops
from ml_debug.bench.config import BenchConfig
from ml_debug.core import output, testhooks
from ml_debug.core.errors import first_line

if TYPE_CHECKING:
    from ml_debug.dist.world import World

SCHEMA = "mldebug.allreduce-bench"
COMMAND = "allreduce-bench"  # the name test hooks use for this command
SCHEMA_VERSION = 1
# Share of free memory the largest size may use (the rest is for the job, caches, other ranks).
MEMORY_SHARE_CPU = 0.5
MEMORY_SHARE_GPU = 0.8


@dataclass
class SizeResult:
    """One row of the table (nccl-tests' columns plus the per-rank view)."""

    size: int  # bytes, nccl-tests' S
    count: int  # elements in the S buffer
    dtype: str
    op: str | None
    root: int | None
    time_us: float  # mean time of one operation, combined across ranks by `average`
    algbw: float  # GB/s (1e9 bytes/s)
    busbw: float  # GB/s
    rank_time_us: list[float]  # each rank's own mean
    slowest_rank: int
    max_time_us: float
    spread: float  # (slowest - fastest) / fastest
    straggler: int | None  # the rank slower than the others' median by more than the threshold
    wrong: int | None  # None when the verification pass was skipped (--no-check)
    wrong_by_rank: dict[int, int] = field(default_factory=dict)


@dataclass
class Straggler:
    rank: int
    host: str
    times_slower: float  # median over flagged sizes of its time / the others' median
    sizes_flagged: int
    sizes_total: int  # the large sizes it was judged on


@dataclass
class CollectiveResult:
    collective: str
    op: str | None
    bus_factor: float
    sizes: list[SizeResult]
    large_from: int  # sizes >= this count as large in the footer average
    avg_busbw_large: float
    peak_busbw: float
    peak_size: int
    wrong_total: int
    straggler: Straggler | None
    dropped_sizes: list[int]
    expect_ok: bool | None
    error: str | None = None


@dataclass
class RankInfo:
    rank: int
    host: str
    node_rank: int
    local_rank: int
    device: str


@dataclass
class PairLink:
    a: int
    b: int
    name_a: str
    name_b: str
    busbw: float
    vs_others: float  # busbw / the median of the other links


@dataclass
class Remeasured:
    """A pair that fell below the floor and was measured again (bandwidth.confirm_slow)."""

    a: int
    b: int
    name_a: str
    name_b: str
    first: float  # GB/s in the first measurement (best of the passes)
    again: list[float]  # GB/s of each re-measurement (best of its passes), in order
    slow: bool  # still below the floor after them: named a slow link; else cleared (a transient)


@dataclass
class PairwiseResult:
    units: str  # "rank" or "node"
    names: list[str]
    size: int
    iters: int
    passes: int  # the schedule ran this many times; each pair keeps its best pass
    matrix: list[list[float | None]]  # GB/s per direction, both directions at once (sendrecv busbw)
    median: float
    threshold: float
    rounds: int
    slow_links: list[PairLink]  # only links that re-measuring confirmed (see remeasured)
    slow_units: list[str]
    remeasures: int  # the most re-measurements a pair gets; each is best of `passes` passes of its round
    remeasured: list[Remeasured]  # every pair measured again, cleared or not


@dataclass
class BenchResult:
    ok: bool
    summary: str
    mode: str  # "sweep" or "pairwise"
    world_size: int
    nnodes: int
    backend: str
    device: str
    dtype: str
    op: str
    iters: int
    warmup: int
    average: str
    quick: bool
    check: bool
    expect_busbw: float | None
    units: dict[str, str]
    collectives: list[CollectiveResult]
    pairwise: PairwiseResult | None
    ranks: list[RankInfo]
    notes: list[str]
    test_faults: str | None
    wall_s: float


UNITS = {"size": "bytes (binary K/M/G in arguments)", "time": "microseconds per operation",
         "algbw": "GB/s = 1e9 bytes/s, size / time", "busbw": "GB/s, algbw x bus factor (nccl-tests)"}


# ---- timing ------------------------------------------------------------------------------------

class Timer:
    """Times one synchronised batch: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        if self.cuda:
            import torch

            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def batch(self, call: Callable[[], None], iters: int, barrier: Callable[[], None],
              hook: Callable[..., object] | None = None) -> float:
        """Seconds per operation for `iters` back-to-back calls that start together on all ranks.

        ``hook`` (TEST-ONLY, see ml_debug.core.testhooks) runs inside the timed region after the
        calls, as ``hook(elapsed_s=...)`` with a function that returns the seconds spent so far;
        what it does there is measured, as a straggler's delay would be.
        """
        barrier()
        self.sync()  # the barrier itself must be done before the clock starts
        # A full garbage collection with torch loaded takes ~0.1 s: never let one land in the batch.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._timed(call, iters, hook)
        finally:
            if gc_was_enabled:
                gc.enable()

    def _timed(self, call: Callable[[], None], iters: int, hook: Callable[..., object] | None) -> float:
        if self.cuda:
            import torch

            t0 = time.perf_counter()
            self._start.record()
            for _ in range(iters):
                call()
            if hook is not None:
                def since_start() -> float:
                    # The stream idles while the hook holds the host, so the end event lands that much later.
                    torch.cuda.current_stream().synchronize()
                    return time.perf_counter() - t0

                hook(elapsed_s=since_start)
            self._end.record()
            self._end.synchronize()
            return self._start.elapsed_time(self._end) / 1e3 / iters
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        if hook is not None:
            hook(elapsed_s=lambda: time.perf_counter() - t0)
        return (time.perf_counter() - t0) / iters


# ---- the sweep ---------------------------------------------------------------------------------

class _NoProgress:
    def advance(self, n: float = 1, description: str | None = None) -> None:
        pass


def rank0_progress(rank: int, total: int, description: str) -> AbstractContextManager[Any]:
    """A progress bar on rank 0's stderr (when a person watches); the other ranks draw nothing."""
    if rank == 0:
        return output.progress(total, description)
    return nullcontext(_NoProgress())


def memory_limit_bytes(device: str, local_world_size: int) -> int:
    """Bytes one rank may use for buffers: a share of free device (or host) memory."""
    if device.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free * MEMORY_SHARE_GPU)
    import psutil

    return int(psutil.virtual_memory().available * MEMORY_SHARE_CPU / max(1, local_world_size))


def _worst_footprint_ratio(collective: str, n: int) -> float:
    lay = bw.layout(collective, 1 << 30, 1, n)
    # Verification needs index temporaries per chunk on top: count them as a fixed 3 x CHUNK x 8 B.
    return lay.footprint_bytes / lay.size_bytes


def _gather_floats(values: list[float], device: str, dtype: Any) -> list[list[float]]:
    """all_gather of one vector per rank -> [rank][i] (one collective for everything)."""
    import torch
    import torch.distributed as dist

    n = dist.get_world_size()
    t = torch.tensor(values if values else [0.0], dtype=dtype, device=device)
    out = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(out, t)
    return [o.cpu().tolist() for o in out]


def _min_across(value: int, device: str) -> int:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def rank_table(world: World, device: str) -> list[RankInfo]:
    import torch.distributed as dist

    mine = [world.rank, world.host, world.node_rank, world.local_rank, device]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return [RankInfo(*g) for g in gathered]


def run_sweep(cfg: BenchConfig, world: World, device: str, backend: str) -> BenchResult:
    """Run every requested collective over the size sweep on this rank; all ranks call it."""
    import torch.distributed as dist

    started = time.perf_counter()
    n, rank = dist.get_world_size(), dist.get_rank()
    cfg = cfg.resolved(device.startswith("cuda"))
    assert cfg.iters is not None and cfg.warmup is not None
    ranks = rank_table(world, device)
    notes: list[str] = []
    limit = _min_across(memory_limit_bytes(device, world.local_world_size), device)
    timer = Timer(device)
    barrier = _barrier(device)
    elem = bw.elem_size(cfg.dtype)
    hooked = testhooks.note(COMMAND)
    if hooked:
        notes.append(hooked)

    share = (f"{MEMORY_SHARE_GPU:.0%} of free GPU memory" if device.startswith("cuda")
             else f"{MEMORY_SHARE_CPU:.0%} of free host memory / local ranks")
    plans: list[tuple[str, list[int], list[int]]] = []
    for coll in cfg.collectives:
        if coll == "sendrecv" and n < 2:
            notes.append("sendrecv: skipped, it needs a peer and this world has one rank")
            continue
        ratio = _worst_footprint_ratio(coll, n)
        kept, dropped = bw.cap_sizes(cfg.sizes(), int(limit / ratio))
        if dropped:
            notes.append(f"{coll}: capped at {bw.format_size(kept[-1])}: {len(dropped)} larger size(s) would not "
                         f"fit in {bw.format_size(limit)} of buffers per rank ({share})")
        plans.append((coll, kept, dropped))

    total_steps = sum(len(k) for _, k, _ in plans)
    times: dict[str, list[float]] = {}
    errors: dict[str, str] = {}
    with rank0_progress(rank, total_steps, "allreduce-bench") as bar:
        for coll, kept, _ in plans:
            times[coll] = []
            for size in kept:
                lay = bw.layout(coll, size, elem, n)
                bar.advance(0, description=f"{coll} {bw.format_size(lay.size_bytes)}")
                try:
                    bufs = ops.allocate(lay, cfg.dtype, device)
                    call = ops.make_call(coll, bufs, rank, n, cfg.op, cfg.root)
                    for _ in range(cfg.warmup):
                        call()
                    timer.sync()
                    hook = (functools.partial(testhooks.call, testhooks.BENCH_TIMED_REGION, rank=rank, collective=coll,
                                              size=lay.size_bytes) if testhooks.active() else None)
                    times[coll].append(timer.batch(call, cfg.iters, barrier, hook))
                    del bufs, call
                except RuntimeError as e:  # e.g. an op this backend lacks: report, go on
                    errors[coll] = first_line(e)
                    times[coll] = []
                    break
                bar.advance(1)

    # Verification after all timing: separate buffers, deterministic data.
    wrong: dict[str, list[int]] = {}
    if cfg.check:
        for coll, kept, _ in plans:
            wrong[coll] = []
            if coll in errors:
                continue
            for size in kept:
                lay = bw.layout(coll, size, elem, n)
                bufs = ops.allocate(lay, cfg.dtype, device, fill=None)
                ops.fill_inputs(coll, bufs, rank, n, cfg.op, cfg.root)
                ops.make_call(coll, bufs, rank, n, cfg.op, cfg.root)()
                timer.sync()
                wrong[coll].append(ops.count_wrong(coll, bufs, rank, n, cfg.op, cfg.root, cfg.dtype))
                del bufs

    # One gather of every measurement: [rank][i]. Errors differ per rank only in text; they are
    # collective failures, so every rank saw one.
    import torch

    flat_t = [t for coll, _, _ in plans for t in times.get(coll, [])]
    flat_w = [float(w) for coll, _, _ in plans for w in wrong.get(coll, [])]
    all_t = _gather_floats(flat_t, device, torch.float64)
    all_w = _gather_floats(flat_w, device, torch.float64) if cfg.check else []

    results: list[CollectiveResult] = []
    ti = wi = 0
    for coll, kept, dropped in plans:
        rows: list[SizeResult] = []
        for k, size in enumerate(kept if coll not in errors else []):
            lay = bw.layout(coll, size, elem, n)
            rank_t = [all_t[r][ti + k] for r in range(n)]
            t = bw.across_ranks(rank_t, cfg.average)
            w_by_rank = {r: int(all_w[r][wi + k]) for r in range(n)} if cfg.check else {}
            slowest = max(range(n), key=lambda r: rank_t[r])
            rows.append(SizeResult(
                size=lay.size_bytes, count=lay.count, dtype=cfg.dtype,
                op=cfg.op if coll in bw.REDUCING else None,
                root=cfg.root if coll in bw.ROOTED else None,
                time_us=t * 1e6, algbw=bw.algbw_gbps(lay.size_bytes, t),
                busbw=bw.busbw_gbps(coll, lay.size_bytes, t, n),
                rank_time_us=[x * 1e6 for x in rank_t], slowest_rank=slowest, max_time_us=max(rank_t) * 1e6,
                spread=bw.spread(rank_t), straggler=bw.slow_outlier(rank_t, cfg.straggler_threshold),
                wrong=sum(w_by_rank.values()) if cfg.check else None,
                wrong_by_rank={r: c for r, c in w_by_rank.items() if c},
            ))
        if coll not in errors:
            ti += len(kept)
            wi += len(kept) if cfg.check else 0
        results.append(_summarise(coll, cfg, n, rows, dropped, ranks, errors.get(coll)))

    return _finish(cfg, n, device, backend, results, None, ranks, notes, started, testhooks.describe(COMMAND))


def _barrier(device: str) -> Callable[[], None]:
    import torch.distributed as dist

    if device.startswith("cuda"):
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        return lambda: dist.barrier(device_ids=[index])
    return lambda: dist.barrier()


def _summarise(coll: str, cfg: BenchConfig, n: int, rows: list[SizeResult], dropped: list[int],
               ranks: list[RankInfo], error: str | None) -> CollectiveResult:
    sizes = [r.size for r in rows]
    large = set(bw.large_sizes(sizes))
    large_bw = [r.busbw for r in rows if r.size in large and math.isfinite(r.busbw)]
    peak = max(rows, key=lambda r: r.busbw, default=None)
    # Small sizes are latency-bound and one descheduled rank shows up as noise there: a rank is named
    # a straggler only when it is the outlier in more than half of the large sizes.
    large_rows = [r for r in rows if r.size in large]
    flagged = [r.straggler for r in large_rows if r.straggler is not None]
    straggler = None
    if flagged:
        who = statistics.mode(flagged)
        mine = [r for r in large_rows if r.straggler == who]
        if len(mine) * 2 > len(large_rows):
            ratios = [r.rank_time_us[who] / statistics.median(t for i, t in enumerate(r.rank_time_us) if i != who)
                      for r in mine]
            straggler = Straggler(who, ranks[who].host, statistics.median(ratios), len(mine), len(large_rows))
    avg_large = statistics.fmean(large_bw) if large_bw else 0.0
    return CollectiveResult(
        collective=coll, op=cfg.op if coll in bw.REDUCING else None, bus_factor=bw.bus_factor(coll, n),
        sizes=rows, large_from=min(large) if large else 0, avg_busbw_large=avg_large,
        peak_busbw=peak.busbw if peak else 0.0, peak_size=peak.size if peak else 0,
        wrong_total=sum(r.wrong or 0 for r in rows), straggler=straggler, dropped_sizes=dropped,
        expect_ok=None if cfg.expect_busbw is None else avg_large >= cfg.expect_busbw, error=error)


def _finish(cfg: BenchConfig, n: int, device: str, backend: str,
            results: list[CollectiveResult], pairwise: PairwiseResult | None, ranks: list[RankInfo],
            notes: list[str], started: float, test_faults: str | None = None) -> BenchResult:
    """The verdict; ``test_faults`` says which TEST-ONLY hooks shaped this run (none: None)."""
    problems: list[str] = []
    good: list[str] = []
    for c in results:
        if c.error:
            problems.append(f"{c.collective} failed: {c.error}")
            continue
        if c.wrong_total:
            bad_ranks = sorted({r for s in c.sizes for r in s.wrong_by_rank})
            bad_sizes = sum(1 for s in c.sizes if s.wrong)
            problems.append(f"{c.collective}: {c.wrong_total} wrong element(s) on rank(s) "
                            f"{','.join(map(str, bad_ranks))} in {bad_sizes} of {len(c.sizes)} sizes")
        if c.straggler:
            s = c.straggler
            problems.append(f"{c.collective}: rank {s.rank} ({s.host}) is a straggler, {s.times_slower:.1f}x "
                            f"the others' time in {s.sizes_flagged} of {s.sizes_total} large sizes")
        if c.expect_ok is False:
            problems.append(f"{c.collective}: busbw {c.avg_busbw_large:.3g} GB/s is below the expected "
                            f"{cfg.expect_busbw:g} GB/s")
        if len(results) == 1:
            good.append(f"{c.collective} busbw {c.avg_busbw_large:.3g} GB/s (avg >= {bw.format_size(c.large_from)}), "
                        f"peak {c.peak_busbw:.3g} GB/s at {bw.format_size(c.peak_size)}")
        else:
            good.append(f"{c.collective} {c.avg_busbw_large:.3g}")
    if len(results) > 1 and good:
        good = [f"busbw GB/s (avg over the large sizes): {', '.join(good)}"]
    if pairwise is not None:
        checks = {(r.a, r.b): len(r.again) for r in pairwise.remeasured}
        cleared = [r for r in pairwise.remeasured if not r.slow]
        if pairwise.slow_links:
            links = ", ".join(f"{link.name_a}<->{link.name_b} ({link.busbw:.3g} GB/s, {link.vs_others:.0%} of the other links' median, "
                              f"re-measured {output.times(checks.get((link.a, link.b), 0))})"
                              for link in pairwise.slow_links)
            problems.append(f"slow link(s): {links}")
        if pairwise.slow_units:
            problems.append(f"slow {pairwise.units}(s): {', '.join(pairwise.slow_units)}")
        if cleared and problems:
            problems.append(f"{len(cleared)} more pair(s) below the floor at first, cleared when re-measured")
        pairs = len(pairwise.names) * (len(pairwise.names) - 1) // 2
        again = (f"; {len(pairwise.remeasured)} pair(s) below the floor re-measured, {len(cleared)} cleared"
                 if pairwise.remeasured else "")
        good.append(f"pairwise median {pairwise.median:.3g} GB/s over {pairs} {pairwise.units} pairs{again}")
    where = f"{n} ranks on {len({r.node_rank for r in ranks})} node(s), {device.split(':')[0]}/{backend}"
    ok = not problems
    if ok:
        checked = ", 0 wrong" if cfg.check and pairwise is None else ""
        summary = f"OK: {'; '.join(good)}{checked} ({where})"
    else:
        summary = f"PROBLEM: {'; '.join(problems)} ({where})"
    if test_faults:
        summary += " [TEST-ONLY fault hook active]"
    return BenchResult(
        ok=ok, summary=summary, mode="pairwise" if pairwise is not None else "sweep", world_size=n,
        nnodes=len({r.node_rank for r in ranks}), backend=backend, device=device.split(":")[0],
        dtype=cfg.dtype, op=cfg.op, iters=cfg.iters or 0, warmup=cfg.warmup or 0, average=cfg.average,
        quick=cfg.quick, check=cfg.check, expect_busbw=cfg.expect_busbw, units=UNITS, collectives=results,
        pairwise=pairwise, ranks=ranks, notes=notes,
        test_faults=test_faults or None, wall_s=time.perf_counter() - started)
