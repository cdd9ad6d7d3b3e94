"""The typed results of dump-stacks and core-bt (pure): built once, JSON field for field, read back
from another node's document unchanged, and valid against the pinned schemas."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest

from ml_debug.core.errors import ExitCode
from ml_debug.core.output import document, to_jsonable
from ml_debug.procs.find import FoundProcess
from ml_debug.stacks import flight
from ml_debug.stacks.cores import CoreReport, CoreSearch, core_bt_result
from ml_debug.stacks.result import Attempt, Frame, ProcessDump, ThreadDump
from ml_debug.stacks.verdict import (
    NO_TARGETS_HINT,
    DumpStacksResult,
    GroupState,
    NodeSummary,
    ProcessSamples,
    ProcessState,
    build_report,
    failed_node,
    read_node_document,
    with_node_note,
)
from tests.conftest import REPO

SCHEMAS = REPO / "ml_debug" / "schemas"
C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
TRAIN = "/home/me/run/train.py"
OPTIONS = {"samples": 1, "interval": 1.0, "dumper": "auto", "timeout": 10.0, "native": False, "locals": False}


def _valid(result: object, name: str) -> dict:
    doc = json.loads(json.dumps(document(f"mldebug.{name}", 1, result, environment={})))
    jsonschema.validate(doc, json.loads((SCHEMAS / f"{name}.json").read_text()))
    return doc["result"]


def _frames(odd: bool) -> list[Frame]:
    inner = (Frame("load_batch", TRAIN, 40, locals={"i": "3"}) if odd
             else Frame("all_reduce", C10D, 2501))
    return [inner, Frame("main", TRAIN, 120), Frame("<module>", TRAIN, 130)]


def _process(host: str, rank: int, *, odd: bool = False, error: str | None = None) -> ProcessSamples:
    pid = 1000 + rank
    target = FoundProcess(pid=pid, host=host, user="me", cmdline="python train.py", exe="/usr/bin/python3",
                    found_by="torchrun pid 999", rank=rank, local_rank=rank % 2, world_size=4, rank_source="RANK",
                    launcher_pid=999, env={"RANK": str(rank)})
    if error:
        return ProcessSamples(target, [ProcessDump(pid=pid, ok=False, error=error, fix="sudo mldebug dump-stacks ...",
                                                   attempts=[Attempt("py-spy", False, 0.5, error)], seconds=0.5,
                                                   taken_at=1.0)])
    native = [Frame("pthread_cond_wait", kind="native", library="/lib/libc.so.6")]
    thread = ThreadDump(thread_id="0x7f", os_thread_id=pid, name="MainThread", is_main=True, frames=_frames(odd),
                        native_frames=native, active=True, owns_gil=False)
    return ProcessSamples(target, [ProcessDump(pid=pid, ok=True, dumper="py-spy", threads=[thread],
                                               attempts=[Attempt("py-spy", True, 0.25)], seconds=0.25, taken_at=1.0)])


def _node(host: str, procs: list[ProcessSamples]) -> NodeSummary:
    dumped = sum(1 for p in procs if p.samples[-1].ok)
    return NodeSummary(host=host, ok=dumped == len(procs), error=None, targets=len(procs), dumped=dumped,
                       launchers=[{"pid": 999, "kind": "torchrun", "cmdline": "torchrun train.py"}], skipped=[],
                       notes=[], ptrace={"scope": 1}, seconds=0.5)


def _local(host: str, ranks: list[int], odd: int | None = None) -> DumpStacksResult:
    procs = [_process(host, r, odd=r == odd) for r in ranks]
    return build_report([_node(host, procs)], procs, OPTIONS, local=True)


def test_the_result_is_typed_frozen_and_its_json_validates() -> None:
    result = _local("node1", [0, 1, 2, 3], odd=3)
    assert result.exit_code is ExitCode.PROBLEM and not result.ok
    assert result.summary == result.verdict and result.verdict.startswith("suspect: rank 3 (node1, pid 1003)")
    assert [(g.id, g.state, g.size) for g in result.groups] == [("A", GroupState.SINGLE, 3),
                                                                ("B", GroupState.SINGLE, 1)]
    assert result.groups[0].collective is not None and result.groups[0].collective.name == "all_reduce"
    assert {p.rank: p.group for p in result.processes} == {0: "A", 1: "A", 2: "A", 3: "B"}
    assert all(p.state is ProcessState.SINGLE for p in result.processes)
    assert result.tree[0].frame == "<module> (train.py:130)" and result.tree[0].count == 4
    assert result.hint is None and result.flight_recorder is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.summary = "changed"  # type: ignore[misc]
    got = _valid(result, "dump-stacks")
    assert got["exit_code"] == 1 and got["processes"][3]["state"] == "single"
    assert got["processes"][3]["samples"][0]["threads"][0]["frames"][0]["locals"] == {"i": "3"}
    # a process's keys: the target's own, then its samples and what the analysis made of it
    assert list(got["processes"][0]) == [f.name for f in dataclasses.fields(FoundProcess)] + [
        "samples", "group", "state", "error", "fix", "kernel"]


def test_a_node_document_reads_back_into_the_same_result() -> None:
    """The remote merge: a node's JSON document, read back and analysed again, gives the same result."""
    local = _local("node1", [0, 1, 2, 3], odd=3)
    body = json.loads(json.dumps(to_jsonable(local)))
    part = read_node_document(body, "node1.rig", note="mldebug 0.0.9 there")
    merged = build_report(part.nodes, part.processes, OPTIONS, fr_records=part.fr_records)
    again = to_jsonable(merged)
    (node,) = again["nodes"]
    assert node["target"] == "node1.rig" and node["notes"] == ["mldebug 0.0.9 there"]
    node.update(target=None, notes=[])
    assert again == body


def test_two_nodes_merge_and_a_node_not_reached_is_said_in_the_summary() -> None:
    parts = [read_node_document(json.loads(json.dumps(to_jsonable(_local(h, ranks, odd=3)))), h)
             for h, ranks in (("node1", [0, 1]), ("node2", [2, 3]))]
    nodes = [n for p in parts for n in p.nodes] + [failed_node("node3", "host key mismatch")]
    result = build_report(nodes, [x for p in parts for x in p.processes], OPTIONS)
    assert result.exit_code is ExitCode.PARTIAL
    assert result.verdict.startswith("suspect: rank 3 (node2, pid 1003) in load_batch (train.py:40)")
    assert result.summary == result.verdict + "; 1 node(s) not reached: node3 (host key mismatch)"
    assert result.groups[0].hosts == ["node1", "node2"]
    _valid(result, "dump-stacks")


def test_nothing_to_dump_and_nothing_dumped_say_why_with_a_hint() -> None:
    empty = build_report([_node("node1", [])], [], OPTIONS, local=True)
    assert empty.exit_code is ExitCode.ENVIRONMENT and empty.hint == NO_TARGETS_HINT
    assert empty.summary.startswith("no processes to dump on node1: no rank under a launcher (torchrun,")
    remote = build_report([_node("node1", []), _node("node2", [])], [], OPTIONS)
    assert remote.summary.startswith("no processes to dump on node1, node2: no rank under a launcher and")

    procs = [_process("node1", r, error="permission denied: the process belongs to uid 65534") for r in (0, 1)]
    refused = build_report([_node("node1", procs)], procs, OPTIONS, local=True)
    assert refused.exit_code is ExitCode.ENVIRONMENT
    assert refused.summary == ("could not dump any of 2 processes on node1: permission denied: the process "
                               "belongs to uid 65534")
    assert refused.hint == "sudo mldebug dump-stacks ..."
    assert [(p.state, p.fix) for p in refused.processes] == [(ProcessState.NOT_DUMPED, refused.hint)] * 2
    assert [(n.pid, n.fix) for n in refused.not_dumped] == [(1000, refused.hint), (1001, refused.hint)]
    for r in (empty, remote, refused):
        _valid(r, "dump-stacks")


def test_flight_recorder_evidence_joins_the_summary_and_a_note_makes_a_new_result() -> None:
    captured = REPO / "tests" / "golden" / "flight_recorder"  # real dumps of tests/jobs/fr_worker.py (2 ranks)
    records = [{"rank": r, "host": "node1", "pid": 1000 + r, "source": "mldebug", "file": None, "ok": True,
                "error": None,
                "process_groups": flight.summarise_dump(flight.parse_dump((captured / f"fr-{r}.json").read_bytes()))}
               for r in (0, 1)]
    procs = [_process("node1", 0), _process("node1", 1, odd=True)]
    result = build_report([_node("node1", procs)], procs, OPTIONS, fr_records=records, local=True)
    assert result.flight_recorder is not None and result.flight_recorder["behind"]
    assert result.summary == result.verdict + "; " + result.flight_recorder["evidence"]
    assert "rank 1 (pg 0) last enqueued #3" in result.summary

    noted = with_node_note(result, "--out-dir: host.json was a symbolic link")
    assert noted.nodes[0].notes == ["--out-dir: host.json was a symbolic link"] and result.nodes[0].notes == []
    assert _valid(noted, "dump-stacks")["flight_recorder"]["ranks"][1]["rank"] == 1


def test_a_node_document_without_what_every_version_writes_is_refused() -> None:
    body = json.loads(json.dumps(to_jsonable(_local("node1", [0]))))
    del body["processes"][0]["host"]
    with pytest.raises(TypeError):
        read_node_document(body, "node1")
    del body["processes"]
    with pytest.raises(KeyError):
        read_node_document(body, "node1")


def test_core_bt_result_exit_codes_and_groups() -> None:
    search = CoreSearch(core_pattern="core", piped=False, globs=["/tmp/run/core*"])
    none = core_bt_result([], search)
    assert none.ok and none.exit_code is ExitCode.OK and none.summary.startswith("no core files found (searched /tmp")

    crash = ThreadDump(thread_id="1", os_thread_id=7, name=None, is_main=True,
                       frames=[Frame("step", TRAIN, 12)], native_frames=[Frame("raise", kind="native")])

    def read(path: str) -> CoreReport:
        return CoreReport(path=path, size=4096, mtime=1.0, ok=True, pid=7, signal="SIGSEGV",
                          executable="/usr/bin/python3", tool="gdb", threads=[crash], crash_frame="raise (libc)",
                          python_frames=["step (train.py:12)"])

    two = core_bt_result([read("/tmp/run/core.1"), read("/tmp/run/core.2")], search)
    assert two.exit_code is ExitCode.PROBLEM and not two.ok
    assert [(g.id, g.count, g.cores) for g in two.groups] == [("A", 2, ["/tmp/run/core.1", "/tmp/run/core.2"])]
    assert two.summary == ("crash: 2 cores, 1 distinct crash(es); most common (2x): SIGSEGV in raise (libc); "
                           "Python: step (train.py:12)")
    bad = CoreReport(path="/tmp/run/core.3", size=0, mtime=0.0, ok=False, error="not read: denied")
    partial = core_bt_result([read("/tmp/run/core.1"), bad], search)
    assert partial.exit_code is ExitCode.PARTIAL
    for r in (none, two, partial):
        got = _valid(r, "core-bt")
        assert got["exit_code"] == int(r.exit_code)

