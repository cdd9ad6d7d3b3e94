"""The roll call (dist/rollcall.py) over a real torch TCPStore, with threads as ranks: all present, a rank
that never checked in, a killed rank (heartbeat stopped), a hung rank (still beating), who reports, the
verdict and its acks, and the store going away."""

from __future__ import annotations

import datetime as _dt
import gc
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import torch.distributed as dist

from ml_debug.dist.rollcall import Absent, Gathered, Heartbeat, RollCall, hosts_store
from ml_debug.dist.store import StoreUnavailable
from ml_debug.dist.world import World

DEADLINE_S = 60.0  # how long a test waits for a rank's thread: far past any wait the protocol should make


class Job:
    """A store hosted by the test (as rank 0 or the launcher's agent would) and one client per rank."""

    def __init__(self) -> None:
        self.host: Any = dist.TCPStore("127.0.0.1", 0, None, True, _dt.timedelta(seconds=20),
                                       wait_for_workers=False)
        self.port = int(self.host.port)
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="rank")

    def client(self) -> Any:
        store = dist.TCPStore("127.0.0.1", self.port, None, False, _dt.timedelta(seconds=20))
        return dist.PrefixStore("job/", store)

    def roll(self, rank: int, world: int, *, wait_s: float = DEADLINE_S, grace_s: float = 20.0,
             heartbeat_s: float = 0.05, dead_after_s: float = 0.5) -> RollCall:
        return RollCall(self.client(), rank, world, wait_s, grace_s, hosts_store=rank == 0,
                        heartbeat_s=heartbeat_s, dead_after_s=dead_after_s)

    def start(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        return self.pool.submit(fn, *args)

    def stop_hosting(self) -> None:
        """The store's host goes away (its process died): the server closes every connection."""
        self.host = None
        gc.collect()


@pytest.fixture
def job() -> Iterator[Job]:
    j = Job()
    try:
        yield j
    finally:
        j.pool.shutdown(wait=True, cancel_futures=True)


def _ident(rank: int) -> str:
    return json.dumps({"rank": rank, "host": f"node{rank // 2}"})


def _arrive(roll: RollCall, stage: str = "work") -> RollCall:
    roll.check_in(_ident(roll.rank))
    roll.start_heartbeat()
    roll.at(stage)
    return roll


def _finish(roll: RollCall, verdict: int = 1) -> tuple[Gathered, int]:
    """A rank's end: gather; the reporter publishes ``verdict``, the others wait for it."""
    got = roll.gather(json.dumps({"rank": roll.rank, "ok": True}))
    if got.is_reporter:
        roll.publish(verdict)
        return got, verdict
    return got, roll.await_verdict()


def _until(cond: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s:g} s: {what}")
        time.sleep(0.01)


def _run_all(job: Job, rolls: list[RollCall], verdict: int = 1) -> dict[int, tuple[Gathered, int]]:
    # Every rank checks in before any gathers, as gpu-test's rendezvous stage guarantees (a rank that
    # had not checked in yet when the first record is posted would be taken for one that never came).
    for roll in rolls:
        _arrive(roll)
    futures = {r.rank: job.start(lambda roll: _finish(roll, verdict), r) for r in rolls}
    return {rank: f.result(timeout=DEADLINE_S) for rank, f in futures.items()}


def test_all_present_one_reporter_every_rank_gets_the_verdict(job: Job) -> None:
    rolls = [job.roll(r, 4) for r in range(4)]
    ends = _run_all(job, rolls, verdict=1)
    assert [g.reporter for g, _ in ends.values()] == [0, 0, 0, 0]
    assert [g.is_reporter for g, _ in ends.values()] == [True, False, False, False]
    assert all(g.present == (0, 1, 2, 3) and g.missing == () for g, _ in ends.values())
    assert [code for _, code in ends.values()] == [1, 1, 1, 1]
    rep = ends[0][0]
    assert {r: json.loads(t)["rank"] for r, t in rep.records.items()} == {0: 0, 1: 1, 2: 2, 3: 3}
    assert rep.absent == {}
    assert ends[1][0].records == {} and ends[1][0].absent == {}  # only the reporter reads the records
    # the reporter hosts the store: it returned from publish only once every other rank had acked
    store = job.client()
    assert all(store.check([f"ack/{r}"]) for r in (1, 2, 3))


def test_rank_that_never_checked_in_is_named_and_not_waited_for(job: Job) -> None:
    # wait_s is the test's own deadline: ending at all proves rank 2 (no check-in) was not waited for
    rolls = [job.roll(r, 3) for r in range(2)]
    for roll in rolls:
        roll.check_in(_ident(roll.rank))
    assert [job.start(roll.await_check_ins, 0.3).result(timeout=DEADLINE_S) for roll in rolls] == [[2], [2]]
    ends = _run_all(job, rolls, verdict=4)
    rep, code = ends[0]
    assert rep.is_reporter and rep.present == (0, 1) and rep.missing == (2,)
    assert rep.absent == {2: Absent(2, None, None, False)}
    assert rep.absent[2].reason == "never checked in"
    assert ends[1][0].missing == (2,) and ends[1][1] == 4 and code == 4


def test_killed_rank_is_named_with_its_last_stage_and_identity(job: Job) -> None:
    dead = _arrive(job.roll(2, 3), stage="broadcast")
    watcher = job.client()
    _until(lambda: int(watcher.add("hb/2", 0)) > 0, "rank 2's heartbeat beats")
    dead.stop_heartbeat()  # killed: no record, no more beats
    assert dead.heartbeat is not None and not dead.heartbeat.running
    ends = _run_all(job, [job.roll(r, 3) for r in range(2)])  # wait_s is long: only the lost heartbeat ends it
    rep = ends[0][0]
    assert rep.present == (0, 1)
    gone = rep.absent[2]
    assert (gone.identity_json, gone.last_stage, gone.heartbeat_lost) == (_ident(2), "broadcast", True)
    assert gone.reason == "stopped during broadcast, no heartbeat"
    assert [code for _, code in ends.values()] == [1, 1]


def test_hung_rank_still_beating_is_named_when_the_wait_runs_out(job: Job) -> None:
    hung = _arrive(job.roll(1, 3, heartbeat_s=0.05, dead_after_s=DEADLINE_S), stage="all_reduce")
    try:
        rolls = [job.roll(r, 3, wait_s=1.0, dead_after_s=DEADLINE_S) for r in (0, 2)]
        ends = _run_all(job, rolls)
    finally:
        hung.stop_heartbeat()
    rep = ends[0][0]
    assert rep.present == (0, 2) and ends[2][0].reporter == 0 and ends[2][1] == 1
    assert rep.absent[1] == Absent(1, _ident(1), "all_reduce", False)
    assert rep.absent[1].reason == "stopped during all_reduce"


def test_reporter_is_the_lowest_rank_present(job: Job) -> None:
    # rank 0 never came: rank 1 judges, and its verdict reaches ranks 2 and 3
    ends = _run_all(job, [job.roll(r, 4) for r in (1, 2, 3)], verdict=4)
    assert {rank: g.reporter for rank, (g, _) in ends.items()} == {1: 1, 2: 1, 3: 1}
    assert [rank for rank, (g, _) in ends.items() if g.is_reporter] == [1]
    assert sorted(ends[1][0].records) == [1, 2, 3] and sorted(ends[1][0].absent) == [0]
    assert [code for _, code in ends.values()] == [4, 4, 4]


def test_no_verdict_when_the_reporter_dies_while_judging(job: Job) -> None:
    reporter = _arrive(job.roll(0, 2))
    other = _arrive(job.roll(1, 2, wait_s=0.5, dead_after_s=0.5))
    fut = job.start(other.gather, json.dumps({"rank": 1}))
    got0 = reporter.gather(json.dumps({"rank": 0}))
    assert got0.is_reporter and fut.result(timeout=DEADLINE_S).reporter == 0
    reporter.stop_heartbeat()  # it dies before publish: the others fall back to "partial"
    assert job.start(other.await_verdict).result(timeout=DEADLINE_S) == 4


def test_store_host_stops_waiting_for_acks_after_grace(job: Job) -> None:
    host = _arrive(job.roll(0, 2, grace_s=0.3))
    peer = _arrive(job.roll(1, 2))
    fut = job.start(peer.gather, json.dumps({"rank": 1}))
    assert host.gather(json.dumps({"rank": 0})).is_reporter
    fut.result(timeout=DEADLINE_S)
    host.publish(0)  # rank 1 never acks (it died after posting): publish still returns
    assert not job.client().check(["ack/1"])


def test_store_going_away_raises_store_unavailable(job: Job) -> None:
    roll = _arrive(job.roll(1, 2))
    assert roll.heartbeat is not None
    job.stop_hosting()
    roll.at("broadcast")  # advisory: no error
    with pytest.raises(StoreUnavailable, match="store went away") as err:
        roll.gather(json.dumps({"rank": 1}))
    assert err.value.exit_code == 4
    with pytest.raises(StoreUnavailable):
        roll.await_verdict()
    with pytest.raises(StoreUnavailable):
        roll.check_in(_ident(1))
    beat = roll.heartbeat
    _until(lambda: not beat.running, "the heartbeat ends when the store is gone")


def test_heartbeat_context_beats_and_stops(job: Job) -> None:
    store = job.client()
    with Heartbeat(store, 5, every_s=0.02) as beat:
        _until(lambda: int(store.add("hb/5", 0)) >= 3, "three beats")
    assert not beat.running  # its thread has ended: nothing bumps hb/5 any more


def test_hosts_store_follows_create_store(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(0, 2, 0, 2, 0, "h", "127.0.0.1", 29500, "torchrun")
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert hosts_store(world) and not hosts_store(World(1, 2, 1, 2, 0, "h", "127.0.0.1", 29500, "torchrun"))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")  # the launcher's agent hosts it
    assert not hosts_store(world)
