"""allreduce-bench's reporting without ranks: summary/straggler logic, the human table (golden),
CSV, and the PNG plots (opened again and their axes checked)."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from ml_debug.bench import bandwidth as bw
from ml_debug.bench import sweep as bench

RANKS = [bench.RankInfo(r, "node-a", 0, r, "cpu") for r in range(2)]


def _row(size: int, times_s: list[float], wrong: dict[int, int] | None = None, n: int = 2) -> bench.SizeResult:
    lay = bw.layout("all_reduce", size, 4, n)
    t = sum(times_s) / n
    return bench.SizeResult(
        size=lay.size_bytes, count=lay.count, dtype="float32", op="sum", root=None, time_us=t * 1e6,
        algbw=bw.algbw_gbps(lay.size_bytes, t), busbw=bw.busbw_gbps("all_reduce", lay.size_bytes, t, n),
        rank_time_us=[x * 1e6 for x in times_s], slowest_rank=max(range(n), key=lambda r: times_s[r]),
        max_time_us=max(times_s) * 1e6, spread=bw.spread(times_s), straggler=bw.slow_outlier(times_s, 0.5),
        wrong=sum((wrong or {}).values()), wrong_by_rank=wrong or {})


def _result(rows: list[bench.SizeResult], expect: float | None = None, faults: str = "") -> bench.BenchResult:
    cfg = bench.BenchConfig(iters=20, warmup=5, expect_busbw=expect)
    coll = bench._summarise("all_reduce", cfg, 2, rows, [], RANKS, None)
    return bench._finish(cfg, 2, "cpu", "gloo", [coll], None, RANKS, [], time.perf_counter(), faults or None)


def _sizes() -> list[int]:
    return bw.sweep(1024, 16 * 2**20, 4)  # 1K 4K 16K 64K 256K 1M 4M 16M


def test_healthy_summary_and_footer_numbers() -> None:
    rows = [_row(s, [s / 1e9 + 1e-4, s / 1e9 + 1.1e-4]) for s in _sizes()]
    res = _result(rows)
    c = res.collectives[0]
    assert res.ok and res.summary.startswith("OK: all_reduce busbw")
    assert c.large_from == 4 * 2**20  # sizes >= 16M / 8
    assert c.avg_busbw_large == pytest.approx((rows[-2].busbw + rows[-1].busbw) / 2)
    assert c.peak_size == rows[-1].size and c.straggler is None and c.wrong_total == 0


def test_problems_make_the_summary_and_ok() -> None:
    rows = [_row(s, [1e-3, 3e-3], wrong={1: 2} if s == 1024 else None) for s in _sizes()]
    res = _result(rows, expect=1000.0, faults="allreduce-bench.slow:rank=1")
    assert not res.ok
    assert "2 wrong element(s) on rank(s) 1 in 1 of 8 sizes" in res.summary
    assert "rank 1 (node-a) is a straggler, 3.0x" in res.summary
    assert "below the expected 1000 GB/s" in res.summary and res.summary.endswith("[TEST-ONLY fault hook active]")
    assert res.collectives[0].expect_ok is False


def test_noise_at_small_sizes_names_no_straggler() -> None:
    # Rank 1 looks 3x slower only at latency-bound small sizes: not a straggler.
    rows = [_row(s, [1e-4, 3e-4] if s < 2**20 else [1e-2, 1.05e-2]) for s in _sizes()]
    assert _result(rows).collectives[0].straggler is None


GOLDEN = """\
# mldebug allreduce-bench: 2 ranks on 1 node(s) (node-a), cpu/gloo, torch 2.x, python 3.x
# dtype float32, 20 iters + 5 warmup per size, time averaged across ranks: avg

all_reduce (busbw = algbw x 1)
 size(B)    count     type  redop  root  time(us)  algbw(GB/s)  busbw(GB/s)    #wrong  slowest  spread
    1024      256  float32    sum     -     100.5       0.0102       0.0102         0        1      1%
 1048576   262144  float32    sum     -    1000.0         1.05         1.05  3 (r0:3)       1*    200%
16777216  4194304  float32    sum     -   10000.0         1.68         1.68         0        0      0%
# Out of bounds values : 3 FAILED
# Avg bus bandwidth    : 1.678 GB/s (sizes >= 16M)
# Peak bus bandwidth   : 1.678 GB/s at 16M
"""


def test_human_table_golden(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from ml_debug.bench.render import render

    rows = [_row(1024, [100e-6, 101e-6]), _row(2**20, [0.5e-3, 1.5e-3], wrong={0: 3}),
            _row(16 * 2**20, [10e-3, 10e-3])]
    res = _result(rows)
    buf = io.StringIO()
    render(res, {"torch": "2.x", "python": "3.x"}, Console(file=buf, width=160, highlight=False, color_system=None))
    text = "\n".join(line.rstrip() for line in buf.getvalue().splitlines())
    assert text.startswith(GOLDEN), text
    assert "# algbw = size / time" in text and text.splitlines()[-1].startswith("PROBLEM: all_reduce: 3 wrong")


def test_csv_rows() -> None:
    from ml_debug.bench.render import SWEEP_COLUMNS, to_csv

    res = _result([_row(s, [1e-3, 1e-3]) for s in (1024, 2048)])
    lines = to_csv(res).splitlines()
    assert lines[0] == ",".join(SWEEP_COLUMNS)
    assert lines[1].split(",")[:5] == ["all_reduce", "1024", "256", "float32", "sum"]
    assert len(lines) == 3


def test_curve_plot_is_a_png_with_log_size_axis(tmp_path: Path) -> None:
    import matplotlib.image

    from ml_debug.bench.plot import plot

    res = _result([_row(s, [s / 1e9 + 1e-4] * 2) for s in _sizes()], expect=0.5)
    info = plot(res, tmp_path / "curve.png")
    assert (info.kind, info.xscale, info.xlabel, info.ylabel) == ("curve", "log", "message size (bytes)",
                                                                 "busbw (GB/s)")
    assert info.series == ["all_reduce"]
    img = matplotlib.image.imread(str(tmp_path / "curve.png"))
    assert img.shape[:2] == (500, 800)  # 8x5 inches at 100 dpi


def test_heatmap_plot(tmp_path: Path) -> None:
    import matplotlib.image

    from ml_debug.bench.plot import plot

    names = ["n0", "n1", "n2", "n3"]
    matrix: list[list[float | None]] = [[None if a == b else 10.0 for b in range(4)] for a in range(4)]
    matrix[0][3] = matrix[3][0] = 2.0
    found = bw.find_slow(matrix, 0.3)
    pw = bench.PairwiseResult("node", names, 2**20, 5, 3, matrix, found.median, 0.3, 3,
                              [bench.PairLink(0, 3, "n0", "n3", 2.0, 0.2)], [], 2,
                              [bench.Remeasured(0, 3, "n0", "n3", 2.0, [1.5, 1.8], True)])
    cfg = bench.BenchConfig(iters=5, warmup=1)
    res = bench._finish(cfg, 4, "cpu", "gloo", [], pw, RANKS, [], time.perf_counter())
    assert not res.ok and "slow link(s): n0<->n3" in res.summary
    info = plot(res, tmp_path / "heat.png")
    assert (info.kind, info.xlabel, info.ylabel, info.series) == ("heatmap", "node", "node", names)
    assert matplotlib.image.imread(str(tmp_path / "heat.png")).ndim == 3


def test_missing_matplotlib_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from ml_debug.bench.plot import require_matplotlib
    from ml_debug.core.errors import EnvironmentProblem

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an interpreter without it finds
    with pytest.raises(EnvironmentProblem) as e:
        require_matplotlib()
    assert "mldebug[plot]" in (e.value.hint or "")


def _pairwise(remeasured: list[bench.Remeasured]) -> bench.BenchResult:
    """4 ranks, 1<->3 slow after two re-measurements, with `remeasured` as the bench found it."""
    names = [f"rank{r}(vm)" for r in range(4)]
    matrix: list[list[float | None]] = [[None if a == b else 10.0 for b in range(4)] for a in range(4)]
    matrix[1][3] = matrix[3][1] = 0.5
    found = bw.find_slow(matrix, 0.7)
    slow = [bench.PairLink(a, b, names[a], names[b], 0.5, 0.05) for a, b in found.slow_links]
    pw = bench.PairwiseResult("rank", names, 2**18, 5, 3, matrix, found.median, 0.7, 3, slow, [], 2, remeasured)
    ranks = [bench.RankInfo(r, "vm", 0, r, "cpu") for r in range(4)]
    return bench._finish(bench.BenchConfig(iters=5, warmup=1), 4, "cpu", "gloo", [], pw, ranks, [], time.perf_counter())


def test_pairwise_summary_and_table_say_which_pairs_were_measured_again() -> None:
    from rich.console import Console

    from ml_debug.bench.render import render

    slow = bench.Remeasured(1, 3, "rank1(vm)", "rank3(vm)", 0.5, [0.45, 0.5], True)
    cleared = bench.Remeasured(2, 3, "rank2(vm)", "rank3(vm)", 2.4, [9.5], False)
    res = _pairwise([slow, cleared])
    assert not res.ok
    assert res.summary.startswith("PROBLEM: slow link(s): rank1(vm)<->rank3(vm) (0.5 GB/s, 5% of the other links' median, "
                                  "re-measured twice); 1 more pair(s) below the floor at first, cleared when "
                                  "re-measured (4 ranks"), res.summary
    buf = io.StringIO()
    render(res, {"torch": "2.x", "python": "3.x"}, Console(file=buf, width=160, highlight=False, color_system=None))
    text = buf.getvalue()
    assert "# re-measured: rank1(vm) <-> rank3(vm): 0.500 GB/s, then 0.450, 0.500: still slow" in text
    assert "# re-measured: rank2(vm) <-> rank3(vm): 2.400 GB/s, then 9.500: cleared (a transient)" in text
    assert "# slow link: rank1(vm) <-> rank3(vm): 0.500 GB/s (5% of the other links' median)" in text
    # a run whose only dip was a transient is OK, and says that it measured a pair again
    transient = bench.Remeasured(0, 1, "a", "b", 2.4, [9.0], False)
    ok = bench._finish(bench.BenchConfig(iters=5, warmup=1), 3, "cpu", "gloo", [],
                       bench.PairwiseResult("rank", ["a", "b", "c"], 2**18, 5, 3, [[None, 9.0, 9.0], [9.0, None, 9.5],
                                                                                  [9.0, 9.5, None]],
                                            9.0, 0.7, 3, [], [], 2, [transient]),
                       [bench.RankInfo(r, "vm", 0, r, "cpu") for r in range(3)], [], time.perf_counter())
    assert ok.ok and ok.summary.startswith("OK: pairwise median 9 GB/s over 3 rank pairs; 1 pair(s) below the floor "
                                           "re-measured, 1 cleared (3 ranks"), ok.summary
