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


def _links(n: int, values: dict[tuple[int, int], float], rest: float = 10.0) -> list[list[float | None]]:
    m: list[list[float | None]] = [[None] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            m[a][b] = m[b][a] = values.get((a, b), rest)
    return m


class _Link:
    """A re-measurement that returns each pair's figures in turn (the last one from then on), and the
    pairs it was asked for, as the ranks would measure them."""

    def __init__(self, figures: dict[tuple[int, int], list[float]], seconds: float = 1.0) -> None:
        self.figures, self.seconds = figures, seconds
        self.asked: list[list[tuple[int, int]]] = []

    def __call__(self, pairs: list[tuple[int, int]]) -> tuple[dict[tuple[int, int], float], float]:
        self.asked.append(list(pairs))
        return {p: self.figures[p][min(len(self.figures[p]), sum(p in a for a in self.asked)) - 1]
                for p in pairs}, self.seconds


def test_confirm_slow_clears_a_transient_and_names_a_slow_link() -> None:
    # 2<->3 dipped in the first measurement only (as CPU contention did on CI); 1<->3 is slow every time.
    link = _Link({(1, 3): [0.5, 0.4], (2, 3): [9.0]})
    done = bw.confirm_slow(_links(4, {(1, 3): 0.5, (2, 3): 2.4}), 0.7, link, most=2)
    assert done.findings.slow_links == [(1, 3)] and done.findings.slow_units == []
    assert link.asked == [[(1, 3), (2, 3)], [(1, 3)]]  # the cleared pair is not measured again
    assert done.again == {(1, 3): [0.5, 0.4], (2, 3): [9.0]}
    assert done.matrix[2][3] == done.matrix[3][2] == 9.0 and done.matrix[1][3] == 0.5  # each pair's best


def test_confirm_slow_a_transient_that_lasts_one_more_measurement_is_cleared_by_the_next() -> None:
    link = _Link({(0, 1): [1.0, 10.0]})
    done = bw.confirm_slow(_links(4, {(0, 1): 1.0}), 0.3, link, most=2)
    assert done.findings.slow_links == [] and done.again == {(0, 1): [1.0, 10.0]}


def test_confirm_slow_nothing_below_the_floor_measures_nothing_again() -> None:
    link = _Link({})
    done = bw.confirm_slow(_links(4, {(0, 1): 8.0}), 0.3, link)
    assert link.asked == [] and done.again == {} and done.findings.slow_links == []


def test_confirm_slow_a_bad_unit_is_named_only_when_its_links_stay_slow() -> None:
    bad = {(0, 3): 2.0, (1, 3): 2.0, (2, 3): 2.0}
    stays = bw.confirm_slow(_links(4, bad), 0.3, _Link({p: [2.0] for p in bad}))
    assert stays.findings.slow_links == [(0, 3), (1, 3), (2, 3)] and stays.findings.slow_units == [3]
    passes = bw.confirm_slow(_links(4, bad), 0.3, _Link({p: [10.0] for p in bad}))
    assert passes.findings.slow_links == [] and passes.findings.slow_units == []


def test_confirm_slow_after_its_budget_measures_only_links_never_measured_again() -> None:
    # The first re-measurement took 5 s of a 3 s budget: 1<->3 is named after one re-measurement.
    link = _Link({(1, 3): [0.5]}, seconds=5.0)
    done = bw.confirm_slow(_links(4, {(1, 3): 0.5}), 0.3, link, most=3, budget_s=3.0)
    assert link.asked == [[(1, 3)]] and done.findings.slow_links == [(1, 3)]
    # A link that falls below a floor that rose is measured again even then: every named link was.
    rising = _Link({(0, 1): [10.0], (0, 2): [10.0], (2, 3): [6.0]}, seconds=5.0)
    start = _links(4, {(0, 1): 1.0, (0, 2): 1.0, (2, 3): 6.0, (1, 2): 8.0})  # median 7: floor 4.9
    done = bw.confirm_slow(start, 0.3, rising, most=3, budget_s=3.0)
    # (0,1), (0,2) cleared: median 10, floor 7, so 2<->3 at 6 is now below it and measured once
    assert rising.asked == [[(0, 1), (0, 2)], [(2, 3)]] and done.findings.slow_links == [(2, 3)]
    assert all(done.again[p] for p in done.findings.slow_links)


def test_find_slow_holds_each_link_against_the_others() -> None:
    # 3 nodes as CI's rig measured them: 0<->2 20x slow, 0<->1 held down by the other tests' ranks on the same
    # CPUs. Against the median of all three (0.104) 0<->2 is at half; against the others' (0.5) at a tenth.
    links = _links(3, {(0, 1): 0.104, (0, 2): 0.05, (1, 2): 0.9})
    found = bw.find_slow(links, 0.7)
    assert found.median == 0.104 and found.others == pytest.approx({(0, 1): 0.475, (0, 2): 0.502, (1, 2): 0.077})
    assert found.slow_links == [(0, 1), (0, 2)]  # both below their floors: both are measured again
    link = _Link({(0, 1): [0.85], (0, 2): [0.05]})
    done = bw.confirm_slow(links, 0.7, link, most=2)
    assert done.findings.slow_links == [(0, 2)] and link.asked == [[(0, 1), (0, 2)], [(0, 2)]]
    assert done.findings.slow_units == []
    assert bw.find_slow(_links(2, {(0, 1): 0.01}), 0.7).slow_links == []  # one link: nothing to hold it against


def test_confirm_slow_a_figure_never_taken_replaces_nothing() -> None:
    done = bw.confirm_slow(_links(4, {(0, 1): 1.0}), 0.3, _Link({(0, 1): [float("nan")]}), most=1)
    assert done.findings.slow_links == [(0, 1)] and done.matrix[0][1] == 1.0


def test_rounds_holding() -> None:
    schedule = bw.round_robin(4)  # [(0,3),(1,2)], [(0,2),(1,3)], [(0,1),(2,3)]
    assert bw.rounds_holding(schedule, [(1, 3)]) == [1]
    assert bw.rounds_holding(schedule, [(2, 3), (0, 3), (1, 2)]) == [0, 2]
    assert bw.rounds_holding(schedule, []) == []
