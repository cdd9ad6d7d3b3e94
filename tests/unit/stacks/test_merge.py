"""Merging and verdicts (pure): grouping, the prefix tree, suspects, rank ranges."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ml_debug.core.ranges import compress, expand
from ml_debug.stacks.merge import Member, analyse, collective_frame
from ml_debug.stacks.result import Frame, ProcessDump, ThreadDump, short_path

C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
LOGGER = "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py"
TRAIN = "/home/me/run/train.py"


def stack(*frames: tuple[str, str, int]) -> list[Frame]:
    """Innermost first, like py-spy."""
    return [Frame(name=n, filename=f, line=line) for n, f, line in frames]


def waiting(op: str = "all_reduce", line: int = 2501, at: int = 88) -> list[Frame]:
    return stack((op, C10D, line), ("wrapper", LOGGER, 83), ("train_step", TRAIN, at), ("main", TRAIN, 120),
                 ("<module>", TRAIN, 130))


def odd(fn: str = "load_batch", line: int = 40) -> list[Frame]:
    return stack((fn, TRAIN, line), ("main", TRAIN, 118), ("<module>", TRAIN, 130))


def dump(pid: int, frames: list[Frame]) -> ProcessDump:
    return ProcessDump(pid=pid, ok=True, dumper="py-spy",
                       threads=[ThreadDump(thread_id="1", os_thread_id=pid, name="MainThread", is_main=True,
                                           frames=frames)])


def member(rank: int | None, *stacks: list[Frame], host: str = "node1", world: int | None = None) -> Member:
    pid = 1000 + (rank or 0)
    return Member(host=host, pid=pid, rank=rank, world_size=world, samples=[dump(pid, s) for s in stacks])


def failed(rank: int, error: str, host: str = "node1", world: int | None = None) -> Member:
    return Member(host=host, pid=1000 + rank, rank=rank, world_size=world,
                  samples=[ProcessDump(pid=1000 + rank, ok=False, error=error)])


def test_the_rank_outside_the_collective_is_named_with_host_pid_and_function() -> None:
    ms = [member(r, waiting(), host=f"node{r // 2}") for r in range(3)] + [member(3, odd(), host="node1")]
    a = analyse(ms)
    assert a.verdict == ("suspect: rank 3 (node1, pid 1003) in load_batch (train.py:40) while 3 ranks wait in "
                         "all_reduce (distributed_c10d.py:2501)")
    assert [(g.id, g.size) for g in a.groups] == [("A", 3), ("B", 1)]
    assert a.suspects[0].kind == "outside-collective" and a.suspects[0].ranks == [3]
    assert not a.ok


def test_prefix_tree_splits_where_stacks_diverge_with_compressed_rank_ranges() -> None:
    ms = [member(r, waiting()) for r in range(0, 63)] + [member(63, odd())] + \
         [member(r, waiting()) for r in range(64, 128)]
    a = analyse(ms)
    (root,) = a.tree
    assert root["frame"] == "<module> (train.py:130)" and root["ranks"] == "ranks 0-127" and root["count"] == 128
    kids = {c["frame"]: c for c in root["children"]}
    assert kids["main (train.py:120)"]["ranks"] == "ranks 0-62,64-127"
    assert kids["main (train.py:118)"]["ranks"] == "rank 63"
    assert "while 127 ranks wait in all_reduce" in a.verdict


def test_a_rank_in_another_collective_is_a_suspect() -> None:
    ms = [member(r, waiting()) for r in range(3)] + [member(3, waiting("broadcast", 2700, at=90))]
    a = analyse(ms)
    assert a.suspects[0].kind == "different-collective"
    assert a.verdict.startswith("suspect: rank 3 (node1, pid 1003) waits in a different collective: broadcast "
                                "while 3 ranks wait in all_reduce (distributed_c10d.py:2501)")


def test_missing_ranks_from_world_size() -> None:
    ms = [member(r, waiting(), world=8) for r in (0, 1, 2, 3, 4, 6)]
    a = analyse(ms)
    assert a.missing_ranks == [5, 7]
    assert a.verdict == ("suspect: ranks 5,7 missing (no process found on the nodes dumped) while 6 ranks wait in "
                         "all_reduce (distributed_c10d.py:2501)")


def test_moving_rank_is_told_from_stuck_ones() -> None:
    ms = [member(r, waiting(), waiting(), waiting()) for r in range(3)]
    ms.append(member(3, odd("spin", 10), odd("spin", 12), odd("helper", 20)))
    a = analyse(ms)
    assert {g.state for g in a.groups} == {"stuck", "moving"}
    assert a.suspects[0].kind == "moving"
    assert a.verdict.startswith("suspect: rank 3 (node1, pid 1003) keeps running (its stack changed across 3 "
                                "samples: spin (train.py:10), spin (train.py:12), helper (train.py:20)) while "
                                "3 ranks are stuck in all_reduce")


def test_everyone_moving_means_running_not_hung() -> None:
    ms = [member(r, odd("step", 1 + r), odd("step", 5 + r)) for r in range(4)]
    a = analyse(ms)
    assert a.ok and a.verdict.startswith("no suspect: all 4 ranks are moving")


def test_all_in_the_same_collective_is_no_suspect() -> None:
    a = analyse([member(r, waiting()) for r in range(4)])
    assert a.ok and not a.suspects
    assert a.verdict.startswith("no suspect: all 4 ranks wait in all_reduce (distributed_c10d.py:2501)")


def test_the_only_rank_not_waiting_could_not_be_dumped() -> None:
    ms = [member(r, waiting()) for r in range(3)] + [failed(3, "timed out after 10 s")]
    a = analyse(ms)
    assert a.suspects[0].kind == "not-dumped"
    assert a.verdict.startswith("suspect: rank 3 (node1, pid 1003) could not be dumped (timed out after 10 s)")


def test_smallest_group_when_nobody_is_in_a_collective() -> None:
    ms = [member(r, odd("forward", 10)) for r in range(5)] + [member(5, odd("load_batch", 40))]
    a = analyse(ms)
    assert a.suspects[0].kind == "smallest-group" and a.suspects[0].ranks == [5]


def test_two_equal_groups_give_no_single_suspect() -> None:
    ms = [member(r, odd("forward", 10)) for r in range(2)] + [member(r, odd("backward", 40)) for r in (2, 3)]
    a = analyse(ms)
    assert not a.suspects and a.verdict.startswith("no single suspect: 2 groups")
    assert a.verdict.endswith("use --samples to tell moving ranks from stuck ones")
    # sampled: the states are known, and the advice to sample is not given again
    twice = [member(r, odd("forward", 10), odd("forward", 10)) for r in range(2)] + \
        [member(r, odd("backward", 40), odd("backward", 40)) for r in (2, 3)]
    a = analyse(twice)
    assert a.verdict.endswith("across 2 samples: 2 ranks stuck, 2 ranks stuck"), a.verdict


def test_duplicate_ranks_fall_back_to_pids() -> None:
    ms = [member(0, waiting()), Member(host="node1", pid=2000, rank=0, samples=[dump(2000, odd())])]
    a = analyse(ms)
    assert "pid 2000 (node1)" in a.verdict


def test_stacks_group_across_different_install_paths() -> None:
    other = [Frame(f.name, f.filename.replace("/venv/lib/python3.11/site-packages", "/opt/conda/lib/python3.11/"
                                                                                    "site-packages"), f.line)
             for f in waiting()]
    a = analyse([member(0, waiting()), member(1, other)])
    assert len(a.groups) == 1


def test_collective_detection() -> None:
    assert collective_frame(waiting("barrier")).name == "barrier"
    assert collective_frame(odd()) is None
    native = [Frame("c10d::ProcessGroupNCCL::WorkNCCL::wait", kind="native")]
    assert collective_frame(native) is not None


def test_short_path() -> None:
    assert short_path(C10D) == "torch/distributed/distributed_c10d.py"
    assert short_path("/usr/lib/python3.11/threading.py") == "threading.py"
    assert short_path("/home/me/run/train.py") == "train.py"
    assert short_path("<frozen importlib._bootstrap>") == "<frozen importlib._bootstrap>"


@given(st.sets(st.integers(min_value=0, max_value=5000), max_size=200))
def test_rank_ranges_round_trip(ranks: set[int]) -> None:
    text = compress(ranks)
    assert expand(text) == sorted(ranks)
    assert compress([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
