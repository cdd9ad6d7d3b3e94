"""bench/sweep directly: the timer, the straggler rule and the verdict on rows as a sweep makes them, and
one real sweep on a one-rank gloo group (run in a child process: a process group is process-wide)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from ml_debug.bench.config import BenchConfig
from ml_debug.bench.sweep import RankInfo, SizeResult, Timer, _finish, _summarise, memory_limit_bytes
from tests.conftest import REPO

RANKS = [RankInfo(r, f"node{r // 2}", r // 2, r % 2, "cpu") for r in range(4)]


def _row(size: int, times: list[float], busbw: float, straggler: int | None) -> SizeResult:
    slowest = max(range(len(times)), key=lambda i: times[i])
    return SizeResult(size=size, count=size // 4, dtype="float32", op="sum", root=None, time_us=max(times),
                      algbw=busbw / 1.5, busbw=busbw, rank_time_us=times, slowest_rank=slowest,
                      max_time_us=max(times), spread=max(times) / min(times) - 1, straggler=straggler, wrong=0)


def test_the_timer_measures_the_calls_after_the_barrier_and_what_the_hook_does_inside() -> None:
    calls: list[str] = []
    timer = Timer("cpu")
    per_op = timer.batch(lambda: calls.append("op"), 4, barrier=lambda: calls.append("barrier"),
                         hook=lambda elapsed_s: time.sleep(0.2))
    assert calls == ["barrier", "op", "op", "op", "op"]  # the barrier before the clock, then the batch
    assert per_op >= 0.2 / 4  # the hook's delay is inside the timed region, as a straggler's would be


def test_a_straggler_is_named_only_when_it_is_slow_in_most_large_sizes() -> None:
    cfg = BenchConfig(collectives=["all_reduce"], expect_busbw=None)
    sizes = [1 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20]  # the last four are "large" (>= 1/8 of the top)
    slow = [_row(s, [10.0, 10.0, 10.0, 30.0], 1.0, 3) for s in sizes[1:4]] + [_row(sizes[4], [10.0] * 4, 2.0, None)]
    result = _summarise("all_reduce", cfg, 4, [_row(sizes[0], [1.0] * 4, 0.1, None), *slow], [], RANKS, None)
    assert result.straggler is not None
    assert (result.straggler.rank, result.straggler.host, result.straggler.sizes_flagged,
            result.straggler.sizes_total, result.straggler.times_slower) == (3, "node1", 3, 4, 3.0)
    assert result.large_from == 1 << 20 and result.peak_size == 8 << 20
    once = [_row(sizes[1], [10.0, 10.0, 10.0, 30.0], 1.0, 3)] + [_row(s, [10.0] * 4, 1.0, None) for s in sizes[2:]]
    assert _summarise("all_reduce", cfg, 4, once, [], RANKS, None).straggler is None  # noise, not a straggler


def test_the_verdict_names_every_problem_and_the_expected_busbw() -> None:
    cfg = BenchConfig(collectives=["all_reduce"], expect_busbw=5.0)
    rows = [_row(s, [10.0] * 4, 2.0, None) for s in (1 << 20, 2 << 20)]
    coll = _summarise("all_reduce", cfg, 4, rows, [], RANKS, None)
    assert coll.expect_ok is False
    res = _finish(cfg, 4, "cpu", "gloo", [coll], None, RANKS, [], time.perf_counter())
    assert not res.ok and res.summary == ("PROBLEM: all_reduce: busbw 2 GB/s is below the expected 5 GB/s "
                                          "(4 ranks on 2 node(s), cpu/gloo)")
    good = _finish(BenchConfig(collectives=["all_reduce"]), 4, "cpu", "gloo",
                   [_summarise("all_reduce", BenchConfig(), 4, rows, [], RANKS, None)], None, RANKS, [], 0.0)
    assert good.ok and good.summary.startswith("OK: all_reduce busbw 2 GB/s (avg >= 1M)")


def test_the_host_memory_a_rank_may_use_is_half_of_what_is_free_shared_by_local_ranks() -> None:
    import psutil

    one, four = memory_limit_bytes("cpu", 1), memory_limit_bytes("cpu", 4)
    free = psutil.virtual_memory().available
    assert 0.3 * free < one <= 0.5 * free * 1.1 and abs(four * 4 - one) < 0.2 * one


SWEEP = """
import json, os, torch.distributed as dist
from ml_debug.bench.config import BenchConfig
from ml_debug.bench.sweep import run_sweep
from ml_debug.dist.world import detect_world
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
store = dist.HashStore()
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
cfg = BenchConfig(collectives=["all_reduce"], quick=True, min_bytes=1024, max_bytes=65536, step_factor=2.0)
r = run_sweep(cfg, detect_world(), "cpu", "gloo")
dist.destroy_process_group()
c = r.collectives[0]
print(json.dumps({"ok": r.ok, "sizes": [s.size for s in c.sizes], "wrong": c.wrong_total, "world": r.world_size,
                  "summary": r.summary}))
"""


def test_a_real_sweep_on_one_gloo_rank_times_and_verifies_every_size() -> None:
    proc = subprocess.run([sys.executable, "-c", SWEEP], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "MASTER_PORT": "29599"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["ok"] and got["world"] == 1 and got["wrong"] == 0, got
    assert got["sizes"] == [1024 * 2 ** i for i in range(7)]  # 1K..64K, doubling
    assert got["summary"].startswith("OK: all_reduce busbw") and "(1 ranks on 1 node(s), cpu/gloo)" in got["summary"]
