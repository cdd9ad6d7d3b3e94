"""Pure bandwidth maths against hand-computed cases (nccl-tests' definitions)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ml_debug.bench import bandwidth as bw
from ml_debug.core.errors import UsageError


@pytest.mark.parametrize(("collective", "n", "factor"), [
    ("all_reduce", 2, 1.0), ("all_reduce", 4, 1.5), ("all_reduce", 8, 1.75), ("all_reduce", 1, 0.0),
    ("all_gather", 4, 0.75), ("reduce_scatter", 8, 0.875), ("all_to_all", 2, 0.5),
    ("broadcast", 8, 1.0), ("reduce", 8, 1.0), ("sendrecv", 8, 1.0),
])
def test_bus_factor(collective: str, n: int, factor: float) -> None:
    assert bw.bus_factor(collective, n) == pytest.approx(factor)


def test_algbw_busbw_hand_computed() -> None:
    # 64 MiB all_reduce in 40 ms on 2 ranks: 67108864 / 0.04 / 1e9 = 1.6777216 GB/s; factor 1.
    assert bw.algbw_gbps(64 * 2**20, 0.040) == pytest.approx(1.6777216)
    assert bw.busbw_gbps("all_reduce", 64 * 2**20, 0.040, 2) == pytest.approx(1.6777216)
    # 8 ranks: busbw = algbw * 14/8.
    assert bw.busbw_gbps("all_reduce", 10**9, 1.0, 8) == pytest.approx(1.75)
    # all_gather of 1 GiB total on 4 ranks in 0.5 s: algbw 2.147483648, busbw * 3/4.
    assert bw.busbw_gbps("all_gather", 2**30, 0.5, 4) == pytest.approx(2.147483648 * 0.75)
    assert bw.algbw_gbps(100, 0.0) == float("inf")


def test_layout_counts() -> None:
    ar = bw.layout("all_reduce", 1024, 4, 4)
    assert (ar.count, ar.in_count, ar.out_count, ar.size_bytes, ar.footprint_bytes) == (256, 256, 0, 1024, 1024)
    ag = bw.layout("all_gather", 1024, 4, 4)
    assert (ag.count, ag.in_count, ag.out_count, ag.block) == (256, 64, 256, 64)
    rs = bw.layout("reduce_scatter", 1024, 4, 4)
    assert (rs.count, rs.in_count, rs.out_count) == (256, 256, 64)
    a2a = bw.layout("all_to_all", 1000, 4, 3)  # 250 elements -> 83 per rank -> 249
    assert (a2a.count, a2a.in_count, a2a.out_count, a2a.size_bytes) == (249, 249, 249, 996)
    sr = bw.layout("sendrecv", 8, 8, 2)
    assert (sr.count, sr.in_count, sr.out_count) == (1, 1, 1)
    tiny = bw.layout("all_gather", 1, 4, 8)  # at least one element per rank
    assert (tiny.count, tiny.in_count) == (8, 1)


@pytest.mark.parametrize(("text", "value"), [
    ("8", 8), ("1K", 1024), ("1k", 1024), ("64M", 64 * 2**20), ("2G", 2 * 2**30), ("1.5K", 1536),
    ("4MB", 4 * 2**20), ("4MiB", 4 * 2**20), (" 16 K ", 16384), ("1T", 2**40),
])
def test_parse_size(text: str, value: int) -> None:
    assert bw.parse_size(text) == value


@pytest.mark.parametrize("text", ["10X", "", "K", "-1", "0", "1..5M", "1 M B", "abc"])
def test_parse_size_bad(text: str) -> None:
    with pytest.raises(UsageError) as e:
        bw.parse_size(text)
    assert e.value.hint and "\n" not in str(e.value)


def test_format_size() -> None:
    assert [bw.format_size(x) for x in (8, 1024, 3 * 2**20, 2**30, 1536)] == ["8", "1K", "3M", "1G", "1.5K"]


def test_sweep() -> None:
    assert bw.sweep(1024, 8192, 2) == [1024, 2048, 4096, 8192]
    assert bw.sweep(1024, 10000, 2) == [1024, 2048, 4096, 8192]
    assert bw.sweep(8, 8, 2) == [8]
    assert bw.sweep(64 * 1024, 4 * 2**20, 4) == [65536, 262144, 1048576, 4194304]
    with pytest.raises(UsageError, match="larger than max"):
        bw.sweep(2048, 1024, 2)
    for bad in ("1", "0.5", "x", "nan"):
        with pytest.raises(UsageError):
            bw.parse_factor(bad)


def test_cap_sizes() -> None:
    assert bw.cap_sizes([1, 2, 4, 8], 4) == ([1, 2, 4], [8])
    assert bw.cap_sizes([16, 32], 5) == ([4], [16, 32])


def test_parse_names() -> None:
    assert bw.parse_dtype("bf16") == "bfloat16"
    assert bw.parse_dtype("FLOAT") == "float32"
    assert bw.elem_size("fp16") == 2
    with pytest.raises(UsageError, match="unknown dtype"):
        bw.parse_dtype("float7")
    assert bw.parse_op("MAX") == "max"
    with pytest.raises(UsageError, match="unknown reduction op"):
        bw.parse_op("xor")
    assert bw.parse_collectives("allreduce, all-gather,a2a,ring") == [
        "all_reduce", "all_gather", "all_to_all", "sendrecv"]
    assert bw.parse_collectives("all") == list(bw.COLLECTIVES)
    with pytest.raises(UsageError, match="unknown collective"):
        bw.parse_collectives("all_reduce,gossip")


def test_across_ranks_and_stragglers() -> None:
    times = [1.0, 3.0, 1.0, 1.2]
    assert bw.across_ranks(times, "avg") == pytest.approx(1.55)
    assert bw.across_ranks(times, "max") == 3.0
    assert bw.across_ranks(times, "min") == 1.0
    assert bw.across_ranks(times, "rank0") == 1.0
    assert bw.spread([2.0, 3.0]) == pytest.approx(0.5)
    assert bw.slow_outlier(times, 0.5) == 1
    assert bw.slow_outlier([1.0, 1.1, 1.2, 1.0], 0.5) is None
    assert bw.slow_outlier([1.0, 3.0], 0.5) == 1
    assert bw.slow_outlier([1.0], 0.5) is None


def test_large_sizes() -> None:
    assert bw.large_sizes([1, 2, 4, 8, 16, 32, 64]) == [8, 16, 32, 64]
    assert bw.large_sizes([]) == []


@given(st.integers(min_value=2, max_value=40))
def test_round_robin_covers_every_pair_once(units: int) -> None:
    rounds = bw.round_robin(units)
    seen = [p for r in rounds for p in r]
    assert sorted(seen) == list(itertools.combinations(range(units), 2))
    for r in rounds:
        flat = [u for p in r for u in p]
        assert len(flat) == len(set(flat))  # disjoint pairs run at the same time
    assert len(rounds) == (units - 1 if units % 2 == 0 else units)


def test_find_slow_link_and_node() -> None:
    def matrix(n: int, values: dict[tuple[int, int], float]) -> list[list[float | None]]:
        m: list[list[float | None]] = [[None] * n for _ in range(n)]
        for a in range(n):
            for b in range(a + 1, n):
                m[a][b] = m[b][a] = values.get((a, b), 10.0)
        return m

    one_link = bw.find_slow(matrix(4, {(0, 1): 3.0}), 0.3)
    assert one_link.slow_links == [(0, 1)] and one_link.slow_units == []
    bad_node = bw.find_slow(matrix(4, {(0, 3): 2.0, (1, 3): 2.0, (2, 3): 2.0}), 0.3)
    assert bad_node.slow_links == [(0, 3), (1, 3), (2, 3)] and bad_node.slow_units == [3]
    healthy = bw.find_slow(matrix(6, {(0, 1): 8.0}), 0.3)
    assert healthy.slow_links == [] and healthy.slow_units == []
    assert bw.find_slow(matrix(2, {(0, 1): 1.0}), 0.3).slow_units == []
