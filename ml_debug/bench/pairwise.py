"""`allreduce-bench --pairwise`: the bandwidth of every pair of nodes (or ranks on one node).

A round-robin (circle method) schedule runs disjoint pairs at the same time, so n units need
n-1 rounds, not n(n-1)/2; the schedule runs three times and each pair keeps its best pass. In each
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

    # The whole schedule runs PASSES times and each pair keeps its best pass: a transient hiccup
    # (another job, a descheduled rank) must not name a link, a persistently slow one stays slow.
    per_round: list[float] = [math.nan] * len(schedule)
    with rank0_progress(rank, PASSES * len(schedule), "pairwise") as bar:
        for pass_no in range(PASSES):
            for ri, pairs in enumerate(schedule):
                found = partner_of(rank, pairs, members)
                if found is None:
                    barrier()  # sit this round out, but keep every rank's barriers in step
                else:
                    peer, pair = found

                    def exchange(peer: int = peer) -> None:
                        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer),
                                                        dist.P2POp(dist.irecv, recv, peer)])
                        for w in works:
                            w.wait()

                    for _ in range(cfg.warmup if pass_no == 0 else min(cfg.warmup, 1)):
                        exchange()
                    timer.sync()
                    hook = (functools.partial(testhooks.call, testhooks.BENCH_PAIR_EXCHANGE, rank=rank, pair=pair)
                            if testhooks.active() else None)
                    t = timer.batch(exchange, cfg.iters, barrier, hook)
                    per_round[ri] = t if math.isnan(per_round[ri]) else min(per_round[ri], t)
                bar.advance(1)

    all_t = _gather_floats(per_round, device, torch.float64)
    m = len(names)
    matrix: list[list[float | None]] = [[None] * m for _ in range(m)]
    for ri, pairs in enumerate(schedule):
        for a, b in pairs:
            total = 0.0
            for pos in range(min(len(members[a]), len(members[b]))):
                ra, rb = members[a][pos], members[b][pos]
                t = max(all_t[ra][ri], all_t[rb][ri])  # the link is as slow as its slower end saw
                total += bw.algbw_gbps(lay.size_bytes, t)
            matrix[a][b] = matrix[b][a] = total
    found_slow = bw.find_slow(matrix, cfg.slow_threshold)
    slow_links = [PairLink(a, b, names[a], names[b], matrix[a][b] or 0.0,
                           (matrix[a][b] or 0.0) / found_slow.median if found_slow.median else 0.0)
                  for a, b in found_slow.slow_links]
    result = PairwiseResult(units=units, names=names, size=lay.size_bytes, iters=cfg.iters, passes=PASSES,
                            matrix=matrix,
                            median=found_slow.median, threshold=cfg.slow_threshold, rounds=len(schedule),
                            slow_links=slow_links, slow_units=[names[u] for u in found_slow.slow_units])
    if len(names) < 2:
        notes.append("pairwise needs at least 2 ranks (or nodes)")
    return _finish(cfg, n, device, backend, [], result, ranks, notes, started, testhooks.describe(COMMAND))
