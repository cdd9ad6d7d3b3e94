"""Pure parts of gpu-test: identity layout checks, arch fit, the verdict, isolation schedule, fault hook."""

from __future__ import annotations

import pytest

from ml_debug.core.errors import UsageError
from ml_debug.gputest.isolate import IsolateEntry, analyse, schedule
from ml_debug.gputest.verdict import (
    ABSENT,
    FAIL,
    OK,
    STAGES,
    Identity,
    RankReport,
    StageResult,
    arch_fit,
    build_result,
    layout_problems,
)
from tests.fakes import faults


def _id(rank: int, host: str = "h0", local: int | None = None, lws: int = 2, node: int | None = None,
        uuid: str | None = None, world: int = 4) -> Identity:
    return Identity(rank, world, rank % lws if local is None else local, lws,
                    rank // lws if node is None else node, host, 100 + rank, "torchrun", "cuda:0", "nccl",
                    "H100", uuid, "9.0")


def test_good_layout_has_no_problems() -> None:
    ids = [_id(r, host=f"h{r // 2}", uuid=f"GPU-{r}") for r in range(4)]
    assert layout_problems(ids) == {}


def test_two_ranks_on_one_gpu() -> None:
    ids = [_id(0, uuid="GPU-a"), _id(1, uuid="GPU-a"), _id(2, host="h1", uuid="GPU-c"),
           _id(3, host="h1", uuid="GPU-d")]
    problems = layout_problems(ids)
    assert set(problems) == {0, 1}
    assert "shares GPU GPU-a on h0 with rank(s) 1" in problems[0]


def test_duplicate_local_rank_and_wrong_local_world_size() -> None:
    ids = [_id(0, local=0, world=3, lws=2), _id(1, local=0, world=3, lws=2), _id(2, local=1, node=0, world=3, lws=2)]
    problems = layout_problems(ids)
    assert "local rank 0" in problems[0] and "local rank 0" in problems[1]
    assert "runs 3 ranks but LOCAL_WORLD_SIZE is 2" in problems[2]


def test_node_rank_claimed_by_two_hosts() -> None:
    ids = [_id(0, host="a", node=0, lws=1, local=0, world=2), _id(1, host="b", node=0, lws=1, local=0, world=2)]
    assert all("claimed by hosts a, b" in v for v in layout_problems(ids).values())


def test_arch_fit() -> None:
    assert arch_fit("9.0", ["sm_80", "sm_90"]) is None
    warning = arch_fit("10.0", ["sm_80", "sm_90"])
    assert warning and "no kernel image" in warning and "sm_100" in warning
    assert "PTX" in (arch_fit("10.0", ["sm_90", "compute_90"]) or "")
    assert arch_fit(None, []) is None


def _report(rank: int, status: dict[str, str] | None = None, answered: bool = True) -> RankReport:
    status = status or {}
    stages = [StageResult(s, status.get(s, OK), 0.01, "x" if s in status else "") for s in STAGES]
    return RankReport(_id(rank, world=2, lws=2), stages, answered)


def test_verdict_ok_and_exit_codes() -> None:
    kw = {"launcher": "torchrun", "backend": "gloo", "stage_timeout_s": 5, "elapsed_s": 1, "reporter_rank": 0,
          "versions": None}
    ok = build_result([_report(0), _report(1)], **kw)
    assert (ok.ok, ok.exit_code, ok.summary) == (True, 0, "2/2 ranks OK on 1 host")
    bad = build_result([_report(0), _report(1, {"all_reduce": FAIL})], **kw)
    assert (bad.ok, bad.exit_code) == (False, 1)
    assert bad.summary == "1/2 ranks OK: rank 1 on h0 failed at all_reduce"
    assert [(f.rank, f.stage) for f in bad.failures] == [(1, "all_reduce")]
    gone = _report(1, {s: ABSENT for s in STAGES}, answered=False)
    gone.note = "stopped during broadcast"
    partial = build_result([_report(0), gone], **kw)
    assert (partial.exit_code, partial.missing_ranks) == (4, [1])
    assert "rank 1 (h0) never answered (stopped during broadcast)" in partial.summary
    assert partial.hints


def test_isolation_schedule() -> None:
    assert schedule(1) == [(0,)]
    assert schedule(2) == [(0,), (1,), (0, 1)]
    assert schedule(4) == [(0,), (1,), (2,), (3,), (0, 1), (2, 3), (1, 2), (3, 0)]


def test_isolation_points_at_bad_device_and_bad_link() -> None:
    def e(members: list[int], ok: bool) -> IsolateEntry:
        return IsolateEntry(members, ok, 0 if ok else 1, "", 1.0)

    bad_gpu = analyse(range(4), [e([0], True), e([1], True), e([2], False), e([3], True), e([0, 1], True),
                                 e([2, 3], False), e([1, 2], False), e([3, 0], True)], "GPU")
    assert bad_gpu.suspects == ["GPU 2 fails alone"] and bad_gpu.exit_code == 1
    bad_link = analyse(range(4), [e([i], True) for i in range(4)] + [e([0, 1], False), e([2, 3], True),
                                                                       e([1, 2], True), e([3, 0], True)], "GPU")
    assert bad_link.suspects == ["the link between GPUs 0 and 1"]
    flaky = analyse(range(4), [e([i], True) for i in range(4)] + [e([0, 1], False), e([2, 3], True),
                                                                    e([1, 2], False), e([3, 0], True)], "GPU")
    assert flaky.suspects[0].startswith("GPU 1 fails in every pair")


def test_fault_hook_parsing() -> None:
    f, g = faults.parse("gpu-test.die:rank=1,stage=broadcast; gpu-test.wrong-value:device=2")
    assert (f.command, f.kind, f.rank, f.stage) == ("gpu-test", "die", 1, "broadcast")
    assert f.applies(1, 5) and not f.applies(0, 5)
    assert g.stage == "all_reduce" and g.applies(0, 2) and not g.applies(0, 1)
    assert faults.parse("") == ()
    for bad in ("gpu-test.explode:rank=1", "gpu-test.die:rank=x", "gpu-test.die:who=1", "die:rank=1",
                "gpu-test.die:stage=nowhere", "gpu-test.wrong-value:rank=1:stage=init"):
        with pytest.raises(UsageError):
            faults.parse(bad)
