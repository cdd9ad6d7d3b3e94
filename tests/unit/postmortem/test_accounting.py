"""Slurm accounting and the job's record, on text the rig's real Slurm 22.05 wrote (tests/data/postmortem/:
sacct of a job whose rank 1 raised, one cancelled by Slurm's memory poll, one whose node went down, one that
completed; sacctmgr's node events; scontrol's record), and the judgement each gets. OUT_OF_MEMORY as a
cgroup cluster records it and TIMEOUT are the same lines with those states."""

from __future__ import annotations

from pathlib import Path

from ml_debug.postmortem.accounting import judge, parse_events, parse_sacct, size_bytes, size_text
from ml_debug.postmortem.jobfiles import default_outputs, find_under, gather, parse_scontrol
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "postmortem"


def _acc(name: str, job: str):
    return parse_sacct((DATA / f"sacct-{name}.txt").read_text(), job)


def test_a_failed_step_its_tasks_and_nodes() -> None:
    acc = _acc("raise", "20")
    assert acc.job is not None and acc.job.state == "FAILED" and acc.job.exit_code == 1
    assert [s.id for s in acc.steps] == ["20.batch", "20.0"]
    main = acc.steps[1]
    assert (main.nodes, main.ntasks, main.layout) == (["node1", "node2"], 2, "Cyclic")
    assert main.task_nodes() == {0: "node1", 1: "node2"}
    assert main.req_mem == 8000 << 20  # the job's 16000M over its two nodes
    j = judge(acc)
    assert (j.failed, j.cause, j.step, j.sentence) == (True, "exit", "20.0", "step 20.0 ended FAILED (exit code 1)")
    assert j.task_nodes == {0: "node1", 1: "node2"}


def test_a_step_cancelled_by_the_memory_poll_is_out_of_memory() -> None:
    j = judge(_acc("oom-poll", "21"))
    assert (j.cause, j.rank, j.node, j.step) == ("oom", 0, "node1", "21.0")
    assert j.sentence == ("step 21.0 ended OUT_OF_MEMORY (cancelled by Slurm's memory poll, OverMemoryKill) "
                          "(limit 100M, MaxRSS 113M, task 0 on node1)")
    assert j.detail["recorded_state"] == "CANCELLED"


def test_out_of_memory_and_timeout_as_recorded_elsewhere() -> None:
    text = (DATA / "sacct-oom-poll.txt").read_text().replace("CANCELLED by 0|0:9", "OUT_OF_MEMORY|0:125")
    j = judge(parse_sacct(text, "21"))
    assert j.sentence == "step 21.0 ended OUT_OF_MEMORY (limit 100M, MaxRSS 113M, task 0 on node1)"
    text = (DATA / "sacct-completed.txt").read_text().replace("COMPLETED", "TIMEOUT", 1)
    j = judge(parse_sacct(text, "23"))
    assert (j.cause, j.sentence) == ("timeout", "job 23 ended TIMEOUT (time limit UNLIMITED)")


def test_node_fail_names_the_node_that_went_down_during_the_job() -> None:
    acc = _acc("node-fail", "22")
    j = judge(acc)
    assert (j.cause, j.node, j.sentence) == ("node-fail", None, "job 22 ended NODE_FAIL")
    acc.node_events = parse_events((DATA / "sacctmgr-events.txt").read_text())
    assert len(acc.node_events) == 4  # the spare node went down in earlier runs too
    j = judge(acc)
    assert (j.cause, j.rank, j.node) == ("node-fail", 0, "spare1")
    assert j.sentence == "job 22 ended NODE_FAIL; spare1 went DOWN (mldebug test: node lost), rank 0 there"
    assert [e["start"] for e in j.detail["node_events"]] == [acc.job.start]  # the one while it ran


def test_a_completed_job_and_a_job_sacct_does_not_know() -> None:
    j = judge(_acc("completed", "23"))
    assert not j.failed and j.sentence == "job 23 ended COMPLETED (exit code 0)"
    j = judge(parse_sacct("", "99"))
    assert not j.failed and j.sentence == "sacct has no record of job 99"


def test_a_job_recorded_twice_keeps_its_last_record() -> None:
    first = (DATA / "sacct-completed.txt").read_text()
    acc = parse_sacct(first.replace("COMPLETED", "FAILED") + first, "23")
    assert acc.job is not None and acc.job.state == "COMPLETED" and len(acc.steps) == 2


def test_sizes() -> None:
    assert size_bytes("197720K") == 197720 << 10 and size_bytes("100M") == 100 << 20
    assert size_bytes("4000Mn") == 4000 << 20 and size_bytes("16", "M") == 16 << 20 and size_bytes("") is None
    assert [size_text(n) for n in (113 << 20, int(63.9 * (1 << 30)), 512 << 10)] == ["113M", "64G", "512K"]


def test_scontrol_record_and_the_files_of_a_job_it_no_longer_knows(tmp_path: Path) -> None:
    fields = parse_scontrol((DATA / "scontrol-raise.txt").read_text())
    assert fields["JobState"] == "FAILED" and fields["NodeList"] == "node[1-2]"
    assert fields["StdOut"].endswith("/raise/train-20.out") and fields["AllocNode:Sid"] == "localhost:4065"
    # ended long ago: only sacct's WorkDir; Slurm's default output name there, else a file named with the id
    (tmp_path / "slurm-77.out").write_text("x\n")
    (tmp_path / "train-77.log").write_text("x\n")
    (tmp_path / "train-177.log").write_text("x\n")
    assert default_outputs("77", str(tmp_path)) == [str(tmp_path / "slurm-77.out")]
    (tmp_path / "slurm-77.out").unlink()
    assert default_outputs("77", str(tmp_path)) == [str(tmp_path / "train-77.log")]
    # an `mldebug launch` directory, a torchrun --log-dir tree and a dump under the WorkDir
    (tmp_path / "mldebug-logs" / "77" / "node1").mkdir(parents=True)
    (tmp_path / "mldebug-logs" / "77" / "node1" / "launch.json").write_text("{}")
    attempt = tmp_path / "runs" / "tel" / "77_ab12" / "attempt_0" / "0"
    attempt.mkdir(parents=True)
    (attempt / "error.json").write_text("{}")
    (tmp_path / "fr").mkdir()
    (tmp_path / "fr" / "nccl_trace_rank_3").write_bytes(b"\x80\x04")
    logs, dumps = find_under(str(tmp_path), "77", None, None)
    assert logs == [str(tmp_path / "mldebug-logs" / "77"), str(tmp_path / "runs" / "tel" / "77_ab12")]
    assert dumps == [str(tmp_path / "fr" / "nccl_trace_rank_3")]
    jf = gather("77", None, str(tmp_path), None, None)
    assert jf.known_by == "sacct" and jf.logs[0] == str(tmp_path / "train-77.log") and jf.dumps == dumps
    assert "slurmctld no longer knows the job" in jf.notes[0]


def test_a_path_from_the_job_record_that_its_user_could_have_planted(tmp_path: Path) -> None:
    """mldebug runs as root on other users' jobs: the job's StdOut that is a link, or a file of another user
    than the job's, is said and not read."""
    import os

    from ml_debug.postmortem.collect import untrusted
    from tests.conftest import require

    require(os.geteuid() == 0, "root (chown)")
    out = tmp_path / "slurm-5.out"
    out.write_text("x\n")
    assert untrusted(str(out), "root") is None and untrusted(str(tmp_path / "gone.out"), "root") is None
    (tmp_path / "link.out").symlink_to("/etc/shadow")
    assert untrusted(str(tmp_path / "link.out"), "root") == "a symbolic link: a path from the job's record is not " \
                                                           "followed"
    os.chown(out, 65534, 65534)
    assert untrusted(str(out), "nobody") is None
    os.chown(out, 1, 1)
    assert untrusted(str(out), "nobody") == "owned by uid 1, not by the job's user nobody: not read"
