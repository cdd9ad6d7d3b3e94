"""One verdict from the sources: which one names the rank, what the others add, where they disagree. The
accounting is the rig's recorded sacct text; the logs' report is `mldebug logs`' own model."""

from __future__ import annotations

from ml_debug.logs.result import Event, LogsReport, Verdict, Who
from ml_debug.postmortem.accounting import judge, parse_sacct
from ml_debug.postmortem.frdumps import FrSource
from ml_debug.postmortem.kernel import NodeKernelLog, parse_lines
from ml_debug.postmortem.verdict import decide
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "postmortem"


def _judged(name: str, job: str):
    return judge(parse_sacct((DATA / f"sacct-{name}.txt").read_text(), job))


def _report(rank: int | None, node: str | None, message: str = "ValueError: bad batch 7 on purpose",
            kind: str = "traceback") -> LogsReport:
    ev = Event(kind=kind, cls="primary", message=message, label=message, who=Who(rank, node), source="x.out",
               line=4, offset=0, source_index=0)
    return LogsReport(verdict=Verdict(status="failure", summary=f"first failure: {message}", primary=ev),
                      sources=[], events=[ev], tracebacks=[], timeline=[], ranks_seen="0-1", world_size=2,
                      nodes=[], progress={}, nccl=None)


def _kernel(node: str, line: str) -> NodeKernelLog:
    return NodeKernelLog(node=node, source="dmesg", readable=True, lines=1, events=parse_lines([line], node))


def _fr(rank: int, why: str, sentence: str) -> FrSource:
    return FrSource(section={"evidence": "flight recorder: " + sentence, "behind": [],
                             "analysis": {"findings": [sentence], "culprits": [{"rank": rank, "host": None,
                                                                                "pid": None, "why": why}]}})


def test_the_logs_name_the_rank_and_accounting_adds_the_step() -> None:
    v = decide(_report(1, None), _judged("raise", "20"), [], None, ["node1", "node2"])
    assert (v.failed, v.rank, v.node, v.named_by) == (True, 1, "node2", "logs")
    assert v.summary == "rank 1 (node2): ValueError: bad batch 7 on purpose; accounting: step 20.0 ended FAILED " \
                        "(exit code 1)"
    assert v.disagreements == []


def test_no_traceback_then_accounting_names_the_out_of_memory_rank_and_the_kernel_agrees() -> None:
    oom = "2026-11-28T03:13:38+0000 node1 kernel: Memory cgroup out of memory: Killed process 4343 (python) " \
          "total-vm:1kB, anon-rss:118000kB, file-rss:0kB"
    report = LogsReport(verdict=Verdict(status="none", summary="no failure found"), sources=[], events=[],
                        tracebacks=[], timeline=[], ranks_seen="0", world_size=1, nodes=[], progress={}, nccl=None)
    v = decide(report, _judged("oom-poll", "21"), [_kernel("node1", oom)], None, ["node1"])
    assert (v.rank, v.node, v.cause, v.named_by) == (0, "node1", "oom", "accounting")
    assert v.summary.startswith("rank 0 (node1): no traceback; accounting: step 21.0 ended OUT_OF_MEMORY")
    assert "kernel: node1: cgroup OOM killer killed pid 4343 (python, 115 MiB resident)" in v.summary
    assert v.disagreements == ["the logs show no failure, accounting does: " + v.findings[0].sentence]


def test_where_the_sources_disagree() -> None:
    xid = "2026-11-28T03:13:38+0000 node1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, off the bus"
    fr = _fr(0, "desync", "desync in collective #6 of pg 0: rank 0 issued gloo:broadcast while rank 1 issued ...")
    v = decide(_report(1, None), _judged("raise", "20"), [_kernel("node1", xid)], fr, ["node1", "node2"])
    assert (v.rank, v.node) == (1, "node2")
    assert v.disagreements == [
        "the logs name rank 1 first, the Flight Recorder rank 0 (desync): the rank that failed first may not be "
        "the rank that went astray",
        "the kernel of node1 reports xid (node1: Xid 79 (GPU has fallen off the bus) on 0000:3b:00), the verdict "
        "names node2"]


def test_the_kernel_says_where_not_whether() -> None:
    segv = "2026-11-28T03:13:37+0000 node1 kernel: python[16240]: segfault at 0 ip 1 sp 2 error 4 in libc.so.6[1+2]"
    v = decide(None, _judged("completed", "23"), [_kernel("node1", segv)], None, ["node1"])
    assert not v.failed and v.summary == "no failure found; accounting: job 23 ended COMPLETED (exit code 0)"
    assert [f.source for f in v.findings] == ["kernel"]  # still said


def test_the_flight_recorder_alone() -> None:
    v = decide(None, None, [], _fr(3, "not-enqueued", "rank 3 never issued collective #9 of pg 0"), [])
    assert (v.rank, v.cause, v.named_by) == (3, "not-enqueued", "flight-recorder")
    assert v.summary == "rank 3: flight-recorder: rank 3 never issued collective #9 of pg 0"


def test_a_slurm_line_about_the_kill_does_not_outrank_accounting() -> None:
    """The logs may class Slurm's own "exceeded memory limit" line as the failure of rank 0: accounting's out
    of memory still names it, and no traceback is said to exist; a traceback of the rank's own would win."""
    line = "slurmstepd-node1: error: StepId=21.0 exceeded memory limit (124370944 > 104857600), being killed"
    v = decide(_report(0, "node1", line, kind="slurm"), _judged("oom-poll", "21"), [], None, ["node1"])
    assert (v.rank, v.cause, v.named_by) == (0, "oom", "accounting")
    assert v.summary.startswith("rank 0 (node1): no traceback; accounting: step 21.0 ended OUT_OF_MEMORY")
    v = decide(_report(0, "node1", "torch.OutOfMemoryError: CUDA out of memory"), _judged("oom-poll", "21"), [],
               None, ["node1"])
    assert (v.named_by, v.cause) == ("logs", "traceback")
