"""`allreduce-bench --pairwise`: the bandwidth of every pair of nodes (or ranks on one node).

A round-robin (circle method) schedule runs disjoint pairs at the same time, so n units need
n-1 rounds, not n(n-1)/2; the schedule runs three times and each pair keeps its best pass. A pair
still below the floor is then measured again (its whole round, as the first time: best of the
passes, the same iterations; up to REMEASURES times) and named slow only when it stays below: a
transient is cleared. In each
round every rank passes one global barrier, then ranks with a partner time a batch of bidirectional
exchanges (isend + irecv of the same size both ways, the sendrecv collective of nccl-tests,
busbw = S / t per direction). Between nodes, local rank k of one
node pairs with local rank k of the other, all at once, so every NIC of the pair is exercised; the
node pair's bandwidth is the sum of those links.

Point-to-point ops on the default group are used rather than one ``new_group`` per pair: that would
need n(n-1)/2 groups, each created collectively by every rank in the same order, which does not
scale to hundreds of nodes; a global barrier per round gives the same common start.
"""

from __future__ import annotations

import functools
import math
import time
from typing import TYPE_CHECKING

from ml_debug.bench import bandwidth as bw
from ml_debug.bench import ops
from ml_debug.bench.config import BenchConfig
from ml_debug.bench.sweep import (
    COMMAND,
    BenchResult,
    PairLink,
    PairwiseResult,
    RankInfo,
    Remeasured,
    Timer,
    _barrier,
    _finish,
    _gather_floats,
    _min_across,
    memory_limit_bytes,
    rank0_progress,
    rank_table,
)
from ml_debug.core import testhooks

if TYPE_CHECKING:
    from ml_debug.dist.world import World

PAIR_SIZE_CPU = 4 * 2**20
PAIR_SIZE_GPU = 256 * 2**20
PASSES = 3
# A link below the floor is measured again, the way the first measurement measured it (its round, PASSES
# passes, the same iterations: the floor comes from figures taken that way, and on CPU ranks sharing cores
# a longer batch or a single one comes out slower), up to REMEASURES times (bandwidth.confirm_slow). One
# figure at or above the floor clears it, so a link is named only when it stays below the floor in the
# first measurement and in every re-measurement. Re-measuring may take REMEASURE_BUDGET times as long as
# the first measurement took; after that only links never measured again are.
REMEASURES = 3
REMEASURE_BUDGET = 2.0
REMEASURE_PAUSES = (0.5, 1.5, 3.0)
"""Seconds every rank waits before each re-measurement (not counted in the budget): a dip that lasts a few
seconds (another job's ranks starting on the node's CPUs; on CI's 2 shared cores one held a pair at a quarter
of the median through three back-to-back re-measurements) is over by the later ones, a slow link is not."""


def unit_layout(ranks: list[RankInfo]) -> tuple[str, list[str], list[list[int]]]:
    """('node'|'rank', unit names, ranks of each unit ordered by local rank)."""
    nodes = sorted({r.node_rank for r in ranks})
    if len(nodes) > 1:
        members = [sorted((r for r in ranks if r.node_rank == node), key=lambda r: r.local_rank)
                   for node in nodes]
        hosts = [m[0].host for m in members]
        names = [h if hosts.count(h) == 1 else f"{h}#{node}" for h, node in zip(hosts, nodes, strict=True)]
        return "node", names, [[r.rank for r in m] for m in members]
    return "rank", [f"rank{r.rank}({r.host})" for r in ranks], [[r.rank] for r in ranks]


def partner_of(rank: int, pairs: list[tuple[int, int]], members: list[list[int]]) -> tuple[int, tuple[int, int]] | None:
    """(partner rank, unit pair) for `rank` in one round, or None when it sits out."""
    for a, b in pairs:
        for mine, other in ((a, b), (b, a)):
            if rank in members[mine]:
                pos = members[mine].index(rank)
                if pos < len(members[other]):
                    return members[other][pos], (a, b)
                return None
    return None


def run_pairwise(cfg: BenchConfig, world: World, device: str, backend: str) -> BenchResult:
    """Measure every unit pair; all ranks call it and get the same result."""
    import torch
    import torch.distributed as dist

    started = time.perf_counter()
    n, rank = dist.get_world_size(), dist.get_rank()
    on_gpu = device.startswith("cuda")
    size_req = cfg.max_bytes or (PAIR_SIZE_GPU if on_gpu else PAIR_SIZE_CPU)
    cfg = cfg.resolved(on_gpu)
    assert cfg.iters is not None and cfg.warmup is not None
    ranks = rank_table(world, device)
    units, names, members = unit_layout(ranks)
    notes: list[str] = []
    hooked = testhooks.note(COMMAND)
    if hooked:
        notes.append(hooked)
    elem = bw.elem_size(cfg.dtype)
    limit = _min_across(memory_limit_bytes(device, world.local_world_size), device)
    size = min(size_req, max(elem, limit // 2))
    if size < size_req:
        notes.append(f"pairwise size capped to {bw.format_size(size)} to fit free memory")
    lay = bw.layout("sendrecv", size, elem, 2)
    bufs = ops.allocate(lay, cfg.dtype, device)
    assert bufs.out is not None
    send, recv = bufs.inp, bufs.out
    timer = Timer(device)
    barrier = _barrier(device)
    schedule = bw.round_robin(len(names))

    def measure(ri: int, iters: int, warmup: int, remeasure: int) -> float:
        """This rank's seconds per exchange in round `ri` (NaN when it sits the round out)."""
        found = partner_of(rank, schedule[ri], members)
        if found is None:
            barrier()  # sit this round out, but keep every rank's barriers in step
            return math.nan
        peer, pair = found

        def exchange() -> None:
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)])
            for w in works:
                w.wait()

        for _ in range(warmup):
            exchange()
        timer.sync()
        hook = (functools.partial(testhooks.call, testhooks.BENCH_PAIR_EXCHANGE, rank=rank, pair=pair,
                                  remeasure=remeasure) if testhooks.active() else None)
        return timer.batch(exchange, iters, barrier, hook)

    def link_gbps(a: int, b: int, times: list[list[float]], col: int) -> float:
        total = 0.0
        for pos in range(min(len(members[a]), len(members[b]))):
            ra, rb = members[a][pos], members[b][pos]
            t = max(times[ra][col], times[rb][col])  # the link is as slow as its slower end saw
            total += bw.algbw_gbps(lay.size_bytes, t)
        return total

    # The whole schedule runs PASSES times and each pair keeps its best pass: a transient hiccup
    # (another job, a descheduled rank) must not name a link, a persistently slow one stays slow.
    iters, warmup_again = cfg.iters, min(cfg.warmup, 1)
    first_started = time.perf_counter()
    per_round: list[float] = [math.nan] * len(schedule)
    with rank0_progress(rank, PASSES * len(schedule), "pairwise") as bar:
        for pass_no in range(PASSES):
            for ri in range(len(schedule)):
                t = measure(ri, cfg.iters, cfg.warmup if pass_no == 0 else warmup_again, 0)
                if not math.isnan(t):
                    per_round[ri] = t if math.isnan(per_round[ri]) else min(per_round[ri], t)
                bar.advance(1)
        # Every rank's times and first-pass seconds, in one collective: all ranks then hold the same
        # figures and take the same decisions below, so their barriers and exchanges stay in step.
        all_t = _gather_floats([*per_round, time.perf_counter() - first_started], device, torch.float64)
        budget_s = REMEASURE_BUDGET * max(row[-1] for row in all_t)
        m = len(names)
        matrix: list[list[float | None]] = [[None] * m for _ in range(m)]
        for ri, pairs in enumerate(schedule):
            for a, b in pairs:
                matrix[a][b] = matrix[b][a] = link_gbps(a, b, all_t, ri)

        done = [0]

        def remeasure(todo: list[bw.Pair]) -> tuple[dict[bw.Pair, float], float]:
            # Whole rounds run again, so a suspect link shares the network (and here, the CPUs) as it did
            # in the first pass: measured alone, a link that is only somewhat slow could pass the floor.
            done[0] += 1
            rerun = bw.rounds_holding(schedule, todo)
            bar.advance(0, f"pairwise: re-measuring {len(todo)} pair(s) below the floor")
            time.sleep(REMEASURE_PAUSES[min(done[0], len(REMEASURE_PAUSES)) - 1])  # every rank: they stay in step
            t0 = time.perf_counter()
            best = [math.nan] * len(rerun)
            for _ in range(PASSES):
                for i, ri in enumerate(rerun):
                    t = measure(ri, iters, warmup_again, done[0])
                    best[i] = t if math.isnan(best[i]) else min(best[i], t)
            times = _gather_floats([*best, time.perf_counter() - t0], device, torch.float64)
            col = {ri: i for i, ri in enumerate(rerun)}
            fresh = {(a, b): link_gbps(a, b, times, col[ri]) for ri in rerun for a, b in schedule[ri] if (a, b) in todo}
            return fresh, max(row[-1] for row in times)

        confirmed = bw.confirm_slow(matrix, cfg.slow_threshold, remeasure, REMEASURES, budget_s)
    first, matrix, found_slow = matrix, confirmed.matrix, confirmed.findings
    median = found_slow.median

    def vs_others(a: int, b: int) -> float:
        others = found_slow.others[(a, b)]
        return (matrix[a][b] or 0.0) / others if others else 0.0

    slow_links = [PairLink(a, b, names[a], names[b], matrix[a][b] or 0.0, vs_others(a, b))
                  for a, b in found_slow.slow_links]
    named = set(found_slow.slow_links)
    remeasured = [Remeasured(a, b, names[a], names[b], first[a][b] or 0.0, again, (a, b) in named)
                  for (a, b), again in sorted(confirmed.again.items())]
    result = PairwiseResult(units=units, names=names, size=lay.size_bytes, iters=cfg.iters, passes=PASSES,
                            matrix=matrix,
                            median=median, threshold=cfg.slow_threshold, rounds=len(schedule),
                            slow_links=slow_links, slow_units=[names[u] for u in found_slow.slow_units],
                            remeasures=REMEASURES, remeasured=remeasured)
    if len(names) < 2:
        notes.append("pairwise needs at least 2 ranks (or nodes)")
    return _finish(cfg, n, device, backend, [], result, ranks, notes, started, testhooks.describe(COMMAND))
