"""The drills' plans, judge and table, called directly (the drills on real jobs: tests/cli/test_drill.py)."""

from __future__ import annotations

import random

import pytest

from ml_debug.drill.catalog import judge
from ml_debug.drill.options import parse_only
from ml_debug.drill.result import Injected, Named
from ml_debug.drill.run import plan_for


def test_the_table_names_each_column_and_each_outcome() -> None:
    from rich.console import Console

    from ml_debug.drill.render import render
    from ml_debug.drill.result import DrillOutcome, DrillResult

    def outcome(drill: str, status: str, named: Named, why: str = "") -> DrillOutcome:
        return DrillOutcome(drill, status, Injected(drill, 1, "vm", 3, "injected_hang"), f"mldebug {drill} --pid 42",
                            named, 0.5, 4.0, f"/drills/{drill}", "t0k3n", why)

    drills = [outcome("hang", "correct", Named([1], "vm", "injected_hang (faults.py:45)")),
              outcome("crash", "missed", Named(), "named no rank")]
    result = DrillResult(False, "1/2 drills named the injected rank; missed: crash", 3, 2, "vm", "this node", 1, drills,
                         1, 1, 0, False, "/drills", 9.0, ["repeat with: mldebug drill --only hang,crash --seed 3"])
    console = Console(width=200, record=True, force_terminal=False)
    render(result, console)
    lines = console.export_text().splitlines()
    assert lines[0].startswith("mldebug drill: 1/2 drills named the injected rank; missed: crash")
    header = next(line for line in lines if line.startswith("┃"))
    for column in ("drill", "injected", "diagnosis", "named", "result", "verdict in", "evidence"):
        assert column in header
    rows = [" ".join(c) for c in (line.split("│")[1:-1] for line in lines if line.startswith("│"))]
    assert "rank 1 (vm) step 3" in rows[0] and "rank 1 (vm): injected_hang (faults.py:45)" in rows[0]
    assert "correct" in rows[0] and "0.5 s" in rows[0] and "/drills/hang" in rows[0]
    assert "missed: named no rank" in rows[1] and " - " in rows[1]
    assert lines[-1] == "repeat with: mldebug drill --only hang,crash --seed 3"


def test_only_keeps_the_catalogue_order() -> None:
    assert parse_only("crash,hang") == ("hang", "crash")


def test_plans_never_miss_rank_zero_and_a_slow_link_has_peers() -> None:
    rng = random.Random(0)
    for _ in range(200):
        assert plan_for("missing-rank", rng, 3).rank in (1, 2)  # rank 0 hosts the rendezvous
        link = plan_for("slow-link", rng, 2)
        assert link.nproc == 4 and link.peer is not None and 0 <= link.rank < link.peer < 4
        hang = plan_for("hang", rng, 3)
        assert 0 <= hang.rank < 3 and 2 <= hang.step <= 4
        # on Slurm: any rank of the whole job; a slow link between two of at least 3 nodes
        assert 0 <= plan_for("crash", rng, 2, nodes=2).rank < 4
        nodes = plan_for("slow-link", rng, 2, nodes=2)
        assert nodes.nproc == 1 and nodes.peer is not None and 0 <= nodes.rank < nodes.peer < 3


@pytest.mark.parametrize(("named", "why"), [
    (Named(ranks=[1], node="h", where="injected_hang (faults.py:45)"), ""),
    (Named(), "named no rank"),
    (Named(ranks=[0], node="h", where="injected_hang (faults.py:45)"), "named rank(s) 0, not 1"),
    (Named(ranks=[0, 1], node="h", where="injected_hang"), "named rank(s) 0,1, not 1"),
    (Named(ranks=[1], node="other", where="injected_hang"), "named node other, not h"),
    (Named(ranks=[1], node="h", where="all_gather_single"), "named all_gather_single, not injected_hang"),
    (Named(ranks=[1], node=None, where="injected_hang"), ""),  # a diagnosis that names no node is judged on the rest
])
def test_judge(named: Named, why: str) -> None:
    assert judge(Injected("hang", 1, "h", 3, "injected_hang"), named) == why


def test_judge_a_slow_link_needs_both_ends() -> None:
    link = Injected("slow-link", 1, "h", None, "1<->3", peer=3)
    assert judge(link, Named(ranks=[1, 3], where="1<->3")) == ""
    assert judge(link, Named(ranks=[1, 2], where="1<->2")) == "named rank(s) 1,2, not 1,3"


def test_the_slow_pair_fault_persists_or_lasts_a_number_of_remeasurements(monkeypatch: pytest.MonkeyPatch) -> None:
    from ml_debug.drill import injectors

    slept: list[float] = []
    monkeypatch.setattr(injectors.time, "sleep", slept.append)

    def slowed(spec: str, pair: tuple[int, int], remeasure: int) -> bool:
        monkeypatch.setenv(injectors.ENV, spec)
        slept.clear()
        injectors.bench_pair_exchange(rank=0, pair=pair, elapsed_s=lambda: 0.5, remeasure=remeasure)
        return slept == [0.5 * 19]  # the exchange took 20x as long

    persistent = injectors.slow_pair_spec(3, 1, 20)
    assert persistent == "slow-pair:1-3,factor=20"
    assert all(slowed(persistent, (1, 3), k) for k in range(4)) and not slowed(persistent, (1, 2), 0)
    transient = injectors.slow_pair_spec(2, 3, 20, remeasures=0)
    assert transient == "slow-pair:2-3,factor=20,remeasures=0"
    assert slowed(transient, (3, 2), 0) and not slowed(transient, (2, 3), 1)
    assert [slowed(injectors.slow_pair_spec(2, 3, 20, remeasures=1), (2, 3), k) for k in range(3)] == [True, True, False]
    for bad in ("slow-pair:2-3,factor=20,remeasures=x", "slow-pair:2-3,speed=3", "slow-pair:2"):
        monkeypatch.setenv(injectors.ENV, bad)
        assert injectors.describe("allreduce-bench") is None  # no fault, and the result says none
