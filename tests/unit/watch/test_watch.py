"""`mldebug watch` without a job: the progress model on samples shaped like top's agent's, the summary
sentence, the options, and the bundle writer (real files, real threads). The GPU values in samples
are what NVML would report; no NVML call is made here."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from ml_debug.core.errors import UsageError
from ml_debug.procs.find import launcher_kind, mldebug_tool
from ml_debug.procs.tree import ProcInfo
from ml_debug.sampling.sample import SAMPLE_SCHEMA, SAMPLE_VERSION, NodeSample
from ml_debug.watch.bundle import Bundle, default_dir, markdown, run_part, tail_lines
from ml_debug.watch.options import WatchOptions, incident_argv
from ml_debug.watch.summary import compose
from ml_debug.watch.verdict import MIN_STACK_SAMPLES, Tracker

T0 = 1_700_000_000.0


def tracker(**kw: Any) -> Tracker:
    args = {"stall": 10.0, "grace": 0.0, "straggler_factor": 2.0, "interval": 1.0, "node_timeout": 5.0,
            "started": T0} | kw
    return Tracker(**args)


def rank_row(rank: int, cpu: float | None, *, state: str = "S", progress: dict | None = None,
             gpu: list[int] | None = None) -> dict:
    return {"pid": 100 + rank, "rank": rank, "local_rank": rank, "world_size": 2, "state": state, "cpu_pct": cpu,
            "gpu": gpu, "progress": progress}


def sample(host: str, ranks: list[dict], gpus: list[dict] | None = None, files: list[dict] | None = None
           ) -> NodeSample:
    """A node sample as its agent's line would give it (read the way the client reads every line)."""
    for r in ranks:
        r.setdefault("label", f"rank {r['rank']}")
    return NodeSample.from_json({"schema": SAMPLE_SCHEMA, "v": SAMPLE_VERSION, "node": {"host": host}, "ranks": ranks,
                                 "gpus": gpus or [], "progress": files or [], "notes": []})


def feed(t: Tracker, when: float, ranks: list[dict], **kw: Any) -> Any:
    t.add_node("n1", sample("h1", ranks, **kw), when)
    return t.evaluate(when)


def test_idle_ranks_stall_after_the_stall_time_and_are_reported_once() -> None:
    t = tracker()
    assert feed(t, T0 + 1, [rank_row(0, 50.0), rank_row(1, 50.0)]) is None  # busy: progress
    for s in range(2, 11):
        assert feed(t, T0 + s, [rank_row(0, 0.2), rank_row(1, 0.1)]) is None
    inc = feed(t, T0 + 11, [rank_row(0, 0.2), rank_row(1, 0.1)])
    assert inc is not None and inc.kind == "stall"
    assert [r["rank"] for r in inc.ranks] == [0, 1] and inc.since == T0 + 1
    assert "ranks 0-1 made no progress for 10 s" in inc.detail and "CPU 50%" in inc.detail
    assert feed(t, T0 + 12, [rank_row(0, 0.2), rank_row(1, 0.1)]) is None  # said once
    assert feed(t, T0 + 13, [rank_row(0, 60.0), rank_row(1, 0.1)]) is None  # rank 0 recovers
    assert {r.rank: r.status for r in t.ranks.values()} == {0: "ok", 1: "stalled"}


def test_grace_holds_back_every_verdict() -> None:
    t = tracker(grace=30.0)
    for s in range(1, 30):
        assert feed(t, T0 + s, [rank_row(0, 0.0)]) is None
    assert feed(t, T0 + 30, [rank_row(0, 0.0)]).kind == "stall"


def test_a_spinning_gpu_is_no_progress_and_a_computing_one_is() -> None:
    spin = {"index": 0, "util_pct": 100.0, "power_pct": 18.0, "pids": [100]}
    work = {"index": 1, "util_pct": 97.0, "power_pct": 85.0, "pids": [101]}
    t = tracker()
    for s in range(1, 12):
        inc = feed(t, T0 + s, [rank_row(0, 100.0, gpu=[0]), rank_row(1, 100.0, gpu=[1])], gpus=[spin, work])
    assert inc is not None and [r["rank"] for r in inc.ranks] == [0]  # 100% CPU, but its NCCL kernel spins
    (r0,) = [r for r in t.ranks.values() if r.rank == 0]
    assert any("100% busy at 18% of its power limit" in s for s in r0.signs)


def test_a_progress_file_decides_even_for_a_busy_rank() -> None:
    t = tracker(grace=5.0)
    incs = [feed(t, T0 + s, [rank_row(0, 100.0, progress={"path": "/m/rank-0.jsonl", "step": 7, "rate": 0.0,
                                                          "age_s": 30.0 + s})]) for s in range(1, 8)]
    # the file stopped 30 s before watching began: stalled as soon as the grace is over, though at 100% CPU
    assert incs[:4] == [None] * 4
    inc = incs[4]
    assert inc is not None and inc.kind == "stall" and inc.since == pytest.approx(T0 - 30)
    assert "/m/rank-0.jsonl grew (step 7)" in inc.detail and incs[5:] == [None, None]


def test_an_unreadable_progress_file_leaves_the_rank_to_its_cpu() -> None:
    """A progress file that cannot be read (a directory, a FIFO) says nothing: the rank is judged by its
    CPU as if there were none. It was judged by that file, which never grows: stalled though busy."""
    t = tracker()
    bad = {"path": "/m/rank-0.jsonl", "step": None, "rate": None, "age_s": None,
           "error": "/m/rank-0.jsonl is a directory, not a regular file: not opened"}
    incs = [feed(t, T0 + s, [rank_row(0, 90.0, progress=bad)]) for s in range(1, 15)]
    assert incs == [None] * 14 and t.ranks["n1:100"].status == "ok"
    assert t.ranks["n1:100"].as_dict(T0 + 15)["progress_file"]["error"] == bad["error"]  # still shown
    idle = [feed(t, T0 + s, [rank_row(0, 0.1, progress=bad)]) for s in range(15, 27)]
    assert any(i is not None and i.kind == "stall" for i in idle)  # and an idle rank still stalls


def test_step_rate_far_below_the_median_is_a_straggler_after_three_samples() -> None:
    t = tracker()
    rates = {0: 10.0, 1: 9.5, 2: 2.0}
    incs = []
    for s in range(1, 6):
        rows = [rank_row(r, 50.0, progress={"path": f"/m/rank-{r}.jsonl", "step": s * 10, "rate": v, "age_s": 0.1})
                for r, v in rates.items()]
        incs.append(feed(t, T0 + s, rows))
    assert incs[:2] == [None, None]
    inc = next(i for i in incs if i is not None)
    assert inc.kind == "straggler" and [r["rank"] for r in inc.ranks] == [2]
    assert "2 steps/s while the median rank makes 9.5" in inc.detail


def _stacks(t: Tracker, when: float, waits: dict[int, bool], where: dict[int, str]) -> None:
    t.add_stacks([{"host": "h1", "pid": 100 + r, "key": f"{where[r]}-{when}", "where": where[r],
                   "in_collective": w} for r, w in waits.items()], when)


def test_lockstep_straggler_is_the_rank_its_peers_wait_for() -> None:
    t = tracker()
    inc = None
    for s in range(1, MIN_STACK_SAMPLES + 3):
        _stacks(t, T0 + s, {0: True, 1: False, 2: True}, {0: "all_gather", 1: "slow_step (x.py:9)", 2: "all_gather"})
        inc = feed(t, T0 + s, [rank_row(r, 40.0) for r in (0, 1, 2)]) or inc
    assert inc is not None and inc.kind == "straggler" and [r["rank"] for r in inc.ranks] == [1]
    assert "ranks 0,2 waited in collectives in" in inc.detail and "mostly in slow_step (x.py:9)" in inc.detail


def test_a_hang_is_not_a_straggler_though_the_others_wait() -> None:
    t = tracker(stall=30.0)
    for s in range(1, MIN_STACK_SAMPLES + 6):  # idle ranks, the same stacks: no progress, no straggler
        t.add_stacks([{"host": "h1", "pid": 100, "key": "a", "where": "all_reduce", "in_collective": True},
                      {"host": "h1", "pid": 101, "key": "b", "where": "stuck (x.py:1)", "in_collective": False}],
                     T0 + s)
        assert feed(t, T0 + s, [rank_row(0, 0.0), rank_row(1, 0.0)]) is None
    assert {r.status for r in t.ranks.values()} == {"ok"}


def test_symmetric_waiting_is_not_a_straggler() -> None:
    t = tracker()
    for s in range(1, 17):
        _stacks(t, T0 + s, {0: s % 2 == 0, 1: s % 3 == 0}, {0: "a", 1: "b"})
        assert feed(t, T0 + s, [rank_row(0, 40.0), rank_row(1, 40.0)]) is None


def test_a_silent_node_is_reported_its_ranks_not_judged_and_after_the_stall_an_incident() -> None:
    t = tracker(stall=20.0)
    t.add_node("n1", sample("h1", [rank_row(0, 50.0)]), T0 + 1)
    t.add_node("n2", sample("h2", [rank_row(1, 50.0)]), T0 + 1)
    for s in range(2, 21):
        t.add_node("n1", sample("h1", [rank_row(0, 50.0)]), T0 + s)
        t.add_node("n2", None, None, "ssh: connection reset")
        assert t.evaluate(T0 + s) is None
    assert not t.nodes["n2"].answering and t.ranks["n2:101"].status == "unknown"
    assert any("node n2 is not answering" in e and "connection reset" in e for e in t.take_events())
    inc = t.evaluate(T0 + 22)
    assert inc is not None and inc.kind == "unreachable" and inc.nodes == ["n2"]
    t.add_node("n3", None, None, "host key mismatch")  # never answered: reported, never an incident
    t.add_node("n1", sample("h1", [rank_row(0, 50.0)]), T0 + 60)
    assert t.evaluate(T0 + 60) is None and not t.nodes["n3"].answering


def test_exited_ranks_end_the_job() -> None:
    t = tracker()
    feed(t, T0 + 1, [rank_row(0, 5.0), rank_row(1, 5.0)])
    feed(t, T0 + 2, [rank_row(0, 5.0)])
    assert not t.job_ended() and t.ranks["n1:101"].status == "exited"
    feed(t, T0 + 3, [])
    assert t.job_ended()


def test_after_a_peer_exits_the_others_stall_sooner_and_the_sentence_says_who_left() -> None:
    t = tracker(stall=300.0)
    feed(t, T0 + 1, [rank_row(0, 50.0), rank_row(1, 50.0)])
    for s in range(2, 40):  # both idle: rank 0 waits in a collective, rank 1 hangs on its own
        assert feed(t, T0 + s, [rank_row(0, 0.0), rank_row(1, 0.0)]) is None
    inc = feed(t, T0 + 40, [rank_row(1, 0.0)])  # rank 0's collective timed out: it left
    assert inc is not None and inc.kind == "stall" and [r["rank"] for r in inc.ranks] == [1]
    assert [r["rank"] for r in inc.exited] == [0] and "rank 0 exited (exited by" in inc.detail
    stacks = {"verdict": "suspect: rank 0 missing (no process found on the nodes dumped)",
              "suspects": [{"kind": "missing", "members": [], "ranks": [0], "where": None}],
              "groups": [{"id": "A", "collective": None, "location": {"where": "injected_hang (faults.py:45)"}}],
              "processes": [{"host": "h1", "pid": 101, "rank": 1, "group": "A"}]}
    sentence, nexts, culprit = compose(inc.as_dict(), stacks, [])
    assert sentence.startswith("rank 1 (h1, pid 101) stuck in injected_hang (faults.py:45) after its peer left: "
                               "rank 0 (h1, pid 100) exited by ")
    assert culprit["rank"] == 1 and nexts == ["mldebug dump-stacks --pid 101 --native"]
    stacks["groups"][0]["collective"] = {"where": "all_gather_single (distributed_c10d.py:4394)"}
    sentence, _, culprit = compose(inc.as_dict(), stacks, [])  # it waits for the one that left: that one
    assert "waits in all_gather_single (distributed_c10d.py:4394) for a peer that left" in sentence
    assert culprit["rank"] == 0 and culprit["why"] == "exited"


def test_d_state_and_zombies_are_signs() -> None:
    t = tracker()
    feed(t, T0 + 1, [rank_row(0, 0.0, state="D"), rank_row(1, 0.0, state="Z")])
    signs = {r.rank: r.signs for r in t.ranks.values()}
    assert "uninterruptible" in signs[0][0] and "zombie" in signs[1][0]


# ------------------------------------------------------------------------------- the sentence

def _incident(kind: str = "stall") -> dict:
    ranks = [{"rank": 0, "host": "h1", "node": "n1", "pid": 100}, {"rank": 1, "host": "h2", "node": "n2", "pid": 101,
                                                                   "straggler_why": "peers wait", "where": "x"}]
    return {"kind": kind, "time": T0 + 40, "detail": "ranks 0-1 made no progress", "ranks": ranks,
            "nodes": ["n1", "n2"], "since": T0 + 10}


STACKS = {"verdict": "suspect: rank 1 (h2, pid 101) stuck in injected_hang (faults.py:45) while 1 rank waits in "
                     "all_gather_single (distributed_c10d.py:4394)",
          "suspects": [{"kind": "outside-collective", "members": ["h2:101"], "ranks": [1], "group": "B",
                        "where": "injected_hang (faults.py:45)"}],
          "groups": [{"id": "B", "location": {"where": "injected_hang (faults.py:45)"}}],
          "processes": [{"host": "h2", "pid": 101, "rank": 1}], "flight_recorder": None}


def test_sentence_names_the_stack_suspect_since_when_and_the_next_command() -> None:
    sentence, nexts, culprit = compose(_incident(), STACKS, ["--hosts", "n1,n2"])
    assert sentence.startswith("rank 1 (h2, pid 101) stuck in injected_hang (faults.py:45) while 1 rank waits")
    assert "no progress since" in sentence and "(30 s)" in sentence
    assert nexts == ["mldebug dump-stacks --hosts n2 --native"]
    assert culprit == {"rank": 1, "host": "h2", "pid": 101, "where": "injected_hang (faults.py:45)",
                       "why": "outside-collective", "node": "n2"}
    assert compose(_incident(), STACKS, [])[1] == ["mldebug dump-stacks --pid 101 --native"]
    assert compose(_incident(), STACKS, ["--slurm-job", "7"])[1] == ["mldebug dump-stacks --slurm-job 7 --native"]


def test_sentence_prefers_a_flight_recorder_desync_over_the_stacks() -> None:
    side = {"ranks": [1], "who": "rank 1", "members": [{"rank": 1, "host": "h2", "pid": 101}], "op": "gloo:all_reduce",
            "text": "gloo:all_reduce [[7]] Float", "odd": True}
    normal = {"ranks": [0], "who": "rank 0", "members": [{"rank": 0, "host": "h1", "pid": 100}],
              "op": "gloo:all_gather", "text": "gloo:all_gather [[8192]] Float", "odd": False}
    fr = {"analysis": {"process_groups": [{"pg": "0", "desc": "default_pg", "not_enqueued": [],
                                           "mismatch": {"seq": 23, "kind": "op", "sides": [side, normal]}}]}}
    sentence, nexts, culprit = compose(_incident(), {**STACKS, "flight_recorder": fr}, [])
    assert sentence.startswith("rank 1 (h2, pid 101) issued a different collective than rank 0 (desync, op mismatch): "
                               "collective #23 of pg 0 (default_pg) is gloo:all_reduce [[7]] Float on rank 1 but "
                               "gloo:all_gather [[8192]] Float on rank 0; its stack: injected_hang (faults.py:45)")
    assert culprit["why"] == "desync" and culprit["op"] == "gloo:all_reduce"
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in nexts[1]


def test_sentence_of_a_straggler_and_of_a_silent_node() -> None:
    sentence, nexts, culprit = compose(_incident("straggler") | {"ranks": _incident()["ranks"][1:]}, None, [],
                                       {"checks": [{"id": "gpu.thermal", "status": "fail", "value": "91 C"}]})
    assert sentence == "rank 1 (h2, pid 101) is a straggler: peers wait; health of h2: gpu.thermal 91 C."
    assert nexts[0] == "mldebug health --level 2" and culprit["rank"] == 1
    sentence, nexts, culprit = compose(_incident("unreachable") | {"detail": "node n2 has not answered for 5.0 min",
                                                                   "nodes": ["n2"]}, None, ["--hosts", "n1,n2"])
    assert sentence.startswith("node(s) n2 stopped answering; node n2 has not answered for 5.0 min")
    assert culprit is None and nexts[0] == "ssh n2 uptime"


# ------------------------------------------------------------------------------- options

def test_options_refuse_what_cannot_work() -> None:
    with pytest.raises(UsageError, match="--pid names a process on this node only"):
        WatchOptions(pids=[1]).validate(remote=True)
    WatchOptions(pids=[1]).validate(remote=False)
    with pytest.raises(UsageError, match="shorter than --interval"):
        WatchOptions(interval=5, stack_every=1).validate(remote=False)
    with pytest.raises(UsageError, match="No closing quotation"):
        WatchOptions(on_incident="scancel 'x").validate(remote=False)
    assert incident_argv("sh -c 'echo $MLDEBUG_INCIDENT > f'") == ["sh", "-c", "echo $MLDEBUG_INCIDENT > f"]


def test_options_refuse_now_with_keep_watching_and_a_straggler_factor_not_above_1() -> None:
    """--now writes one bundle and exits, so --keep-watching beside it was silently ignored; a factor
    F <= 1 calls every rank below the median (or above it) a straggler."""
    with pytest.raises(UsageError, match="--keep-watching would be ignored"):
        WatchOptions(now=True, keep_watching=True).validate(remote=False)
    for factor in (0.5, 1.0):
        with pytest.raises(UsageError, match=f"--straggler-factor {factor:g} is not above 1"):
            WatchOptions(straggler_factor=factor).validate(remote=False)
    WatchOptions(straggler_factor=0.0).validate(remote=False)  # never
    WatchOptions(straggler_factor=1.5, now=True).validate(remote=False)


def test_a_pid_that_does_not_exist_here_is_a_usage_error_at_once() -> None:
    """It waited --grace (60 s) and exited 3; the pid is checked before anything starts, in dump-stacks'
    words. A pid above the kernel's pid_max can never exist."""
    from tests.conftest import mldebug

    missing = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    proc = mldebug("watch", "--pid", "1", "--pid", str(missing), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"mldebug: error: --pid {missing}: no such process on this node\nhint: ")
    assert proc.stdout == ""


@pytest.mark.parametrize(("argv", "kind"), [
    (["/venv/bin/python3", "/venv/bin/mldebug", "train", "--nproc-per-node", "2"], "mldebug"),
    (["python", "-m", "ml_debug", "gpu-test", "--nproc-per-node=4"], "mldebug"),
    (["python", "-u", "-m", "ml_debug.cli.worker", "train", "--steps", "3"], None),  # a rank, not a launcher
    (["/venv/bin/python3", "/venv/bin/mldebug", "watch", "--pid", "7"], None),
])
def test_mldebug_self_launcher_is_a_launcher(argv: list[str], kind: str | None) -> None:
    info = ProcInfo(pid=1, ppid=0, uid=0, user="root", state="S", cmdline=argv, exe="/usr/bin/python3.11", name="x")
    assert launcher_kind(info) == kind


@pytest.mark.parametrize(("argv", "tool"), [
    (["/venv/bin/python3", "/venv/bin/mldebug", "watch", "--slurm-job", "7"], True),  # in a batch script: no rank
    (["python", "-m", "ml_debug", "--json", "dump-stacks", "--local"], True),
    (["mldebug", "top", "--agent", "--interval", "1.0"], True),
    (["python", "-m", "ml_debug", "train", "--steps", "3"], False),  # `srun mldebug train`: a rank
    (["python", "-u", "-m", "ml_debug.cli.worker", "train"], False),
    (["/venv/bin/python3", "/venv/bin/mldebug", "gpu-test"], False),
    (["python", "train.py", "--mldebug"], False),
])
def test_mldebug_diagnostic_commands_are_never_ranks(argv: list[str], tool: bool) -> None:
    assert mldebug_tool(argv) is tool


# ------------------------------------------------------------------------------- the bundle

def test_bundle_parts_time_out_fail_or_succeed_and_the_summary_says_which(tmp_path: Path) -> None:
    b = Bundle(tmp_path / "inc")
    release = threading.Event()
    slow, bad, good = b.part("slow", "a part that hangs"), b.part("bad", "a part that fails"), b.part("good", "ok")
    run_part(slow, lambda p: release.wait(30), timeout=0.2)
    run_part(bad, lambda p: 1 / 0, timeout=5)
    run_part(good, lambda p: p.files.append(b.write("good.txt", "x")), timeout=5)
    release.set()
    assert [(p.status, p.error) for p in (slow, bad, good)] == [
        ("timed-out", "no result within 0.2 s"), ("failed", "ZeroDivisionError: division by zero"), ("ok", None)]
    md = markdown({"summary": "rank 1 is stuck.", "next": ["mldebug dump-stacks --pid 1"], "job": "j",
                   "incident": {"kind": "stall", "time": T0, "detail": "d"}, "status": "complete", "ranks": [],
                   "nodes": [], "parts": [p.as_dict() for p in b.parts]})
    assert md.splitlines()[2] == "**rank 1 is stuck.**"
    assert "| a part that hangs | - | timed-out: no result within 0.2 s |" in md
    assert (tmp_path / "inc" / "good.txt").read_text() == "x"
    assert default_dir("slurm 12/x", T0).name.startswith("mldebug-incident-slurm_12_x-2023")


def test_tail_reads_the_last_lines_and_never_follows_a_planted_link(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.jsonl"
    log.write_text("".join(f'{{"step": {i}}}\n' for i in range(1, 100)))
    assert tail_lines(str(log), 3) == '{"step": 97}\n{"step": 98}\n{"step": 99}\n'
    secret = tmp_path / "secret"
    secret.write_text("root's\n")
    os.symlink(secret, tmp_path / "rank-1.jsonl")
    with pytest.raises(Exception, match="link"):
        tail_lines(str(tmp_path / "rank-1.jsonl"))


def test_no_job_within_duration_is_exit_3_when_the_duration_ends() -> None:
    """--duration 2 with nothing to watch: exit 3 with the hint (it was exit 0, "no incident: 0 rank(s)
    made progress"), and the result says so."""
    import json
    import uuid

    from tests.conftest import mldebug

    proc = mldebug("watch", "--pattern", f"no_such_job_{uuid.uuid4().hex}", "--duration", "2", "--json", timeout=60)
    assert proc.returncode == 3, proc.stderr
    result = json.loads(proc.stdout)["result"]
    assert result["summary"] == "no rank process found to watch" and not result["ok"]
    assert proc.stderr.splitlines()[-1].startswith("hint: name the job: --pid PID")
