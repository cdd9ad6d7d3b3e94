"""The launchers' own accounting names the rank (issue 38, rules 1-7), on real consoles where no worker line
carries a rank.

tests/data/logs/accounting/ holds the consoles of real torchrun runs on this machine (torch 2.13, CPU, the
workers w.py, w2.py, w3.py, w4.py; paths rewritten to /opt/venv and /job):

- torchrun2.log: ``torchrun --nproc-per-node 2``, rank 1 raises, torchrun stops rank 0 (SIGTERM);
- torchrun1.log: ``torchrun --nproc-per-node 1``, rank 0 raises;
- launch2.log: ``python -m torch.distributed.launch --use-env --nproc-per-node 2``, rank 1 raises;
- agent0.log, agent1.log: two agents (``--nnodes 2 --nproc-per-node 2``, c10d rendezvous, LOGLEVEL=INFO),
  rank 3 raises on agent 1; agent 0 then loses the rendezvous store;
- late0.log, late1.log: the same, rank 3 raises after 1 s and rank 1 after 3.5 s: each agent reports its own;
- one_pg_cut.log: ``torchrun --nproc-per-node 1`` of a worker in a gloo process group, cut after torchrun's
  failed line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ml_debug.logs.result import INFO, PRIMARY
from ml_debug.logs.triage import triage
from tests.conftest import REPO
from tests.unit.logs.test_pasted import _numbered, _quoted, _wrapped

DATA = REPO / "tests" / "data" / "logs" / "accounting"

# console: (first failing rank, its message)
CONSOLES = {
    "torchrun2.log": (1, "ValueError: bad batch on rank 1"),
    "torchrun1.log": (0, "ValueError: bad batch on rank 0"),
    "launch2.log": (1, "ValueError: bad batch on rank 1"),
    "agent1.log": (3, "ValueError: bad batch on rank 3"),
    "late0.log": (1, "ValueError: bad batch on rank 1"),
    "late1.log": (3, "ValueError: bad batch on rank 3"),
}
DAMAGE = {"as-is": lambda t: t, "quoted": _quoted, "quoted-twice": lambda t: _quoted(_quoted(t)),
          "wrapped": _wrapped, "numbered": _numbered}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("name", sorted(CONSOLES))
def test_the_agent_names_the_rank_of_an_unlabelled_traceback(name: str, damage: str, tmp_path: Path) -> None:
    """Rules 1-3: no worker line has a rank; torchrun's accounting (its failed line, the pids it stopped, its
    Root Cause) names the rank, and its own traceback that follows is never a rank failing."""
    rank, message = CONSOLES[name]
    path = tmp_path / name
    path.write_text(DAMAGE[damage]((DATA / name).read_text()))
    report = triage([str(path)])
    v = report.verdict
    assert v.status == "failure" and v.primary is not None, v.summary
    assert v.primary.who.rank == rank and v.primary.message == message, v.summary
    assert "torchrun" in v.primary.detail.get("rank_by", ""), v.primary.detail
    assert v.confidence == "high", v.confidence_why
    # the launcher's traceback (run.py, launch.py, ChildFailedError) is its report: no unknown rank failed
    assert not [e for e in report.events if e.cls == PRIMARY and e.who.rank is None and e.strong], report.events
    assert "torchrun" in report.launchers


def test_the_launchers_own_traceback_is_its_report(tmp_path: Path) -> None:
    """Rule 1: with its summary, torchrun's traceback is read as the summary; cut short before it (a paste
    that ends in its frames), it is the launcher's report still, never an "unknown rank" failure."""
    text = (DATA / "torchrun2.log").read_text()
    cut = text[:text.index("    raise ChildFailedError(")]
    (tmp_path / "cut.log").write_text(cut)
    report = triage([str(tmp_path / "cut.log")])
    launcher = [e for e in report.events if e.label == "launcher traceback"]
    assert launcher and all(e.cls == INFO for e in launcher), report.events
    v = report.verdict
    # without its summary, only "local_rank: 1" is said: one agent's local rank (the job may have more nodes)
    assert v.primary is not None and v.primary.who.local_rank == 1 and "bad batch" in v.primary.message, v.summary


def test_an_agent_that_died_reading_an_empty_error_file_reports_a_workers_failure() -> None:
    """Rule 1, found by a CI run of `mldebug drill` (nan on rank 1): rank 0 raised first about rank 1, torchrun
    stopped rank 1 with SIGTERM while it wrote its error file, then died of JSONDecodeError reading the empty file.
    That traceback is the launcher failing to report a worker's failure, never rank 0's own failure."""
    report = triage([str(REPO / "tests" / "data" / "logs" / "launch_nan_agent_read_an_empty_error_file")])
    agent = [e for e in report.events if "JSONDecodeError" in "\n".join(e.text or [])]
    assert agent and all(e.cls == INFO and e.label == "launcher traceback" for e in agent), report.events
    v = report.verdict
    assert v.primary is not None and v.primary.who.rank == 1 and "NonFiniteError" in v.primary.message, v.summary


def test_a_world_of_one_process_is_rank_0() -> None:
    """Rule 3: ``torchrun --nproc-per-node 1`` of a worker in a gloo process group (torch prefixes its traceback
    with ``[rank0]:``), the console cut after torchrun's failed line (no summary): the agent's "local_rank: 0"
    is rank 0, one writer that failed once, not an unattributed one after it."""
    v = triage([str(DATA / "one_pg_cut.log")]).verdict
    assert v.primary is not None and v.primary.who.rank == 0 and "bad batch on rank 0" in v.primary.message, v.summary
    assert "unattributed" not in v.summary and "failed after it" not in v.summary, v.summary
    assert v.primary.time is not None, v.summary  # the agent's line times the failure


@pytest.mark.parametrize("order", ["agent0 first", "agent1 first"])
def test_two_agents_are_ordered_by_their_own_reports(order: str) -> None:
    """Rule 4: each agent's failure is timed by its own report (the failed line, to the millisecond) where the
    traceback's time is only a lower bound; rank 3 failed 2.5 s before rank 1, whatever the files' order."""
    files = [DATA / "late0.log", DATA / "late1.log"]
    if order == "agent1 first":
        files.reverse()
    v = triage([str(f) for f in files]).verdict
    assert v.primary is not None and v.primary.who.rank == 3, v.summary
    assert v.basis == "the launcher's report of the exit", v.basis
    assert [e.who.rank for e in v.independent] == [1], v.summary


def test_an_agent_that_lost_the_rendezvous_is_a_consequence() -> None:
    """Two agents, one failing worker: the other agent's lost store is a consequence, the rank is agent 1's."""
    v = triage([str(DATA / "agent0.log"), str(DATA / "agent1.log")]).verdict
    assert v.primary is not None and v.primary.who.rank == 3, v.summary
    alone = triage([str(DATA / "agent0.log")]).verdict
    assert alone.status == "secondary-only", alone.summary


def test_the_agents_global_ranks_name_the_failed_local_rank(tmp_path: Path) -> None:
    """Rule 6: the agent's rendezvous result (``global_ranks=[2, 3]``, torch 2.x's lines, or flattened onto one
    line as a paste or a log shipper leaves it) says local rank 1 is rank 3, with no summary to say so."""
    text = (DATA / "agent1.log").read_text()
    cut = text[:text.index("\n", text.index("failed (exitcode: 1)")) + 1]
    (tmp_path / "multi-line.log").write_text(cut)
    lines = cut.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.endswith("restart_count=0"))
    flat = lines[:start] + [" ".join(ln.split("] ", 1)[1].strip() for ln in lines[start:start + 11])] + \
        lines[start + 11:]
    (tmp_path / "flattened.log").write_text("\n".join(flat) + "\n")
    for name in ("multi-line.log", "flattened.log"):
        v = triage([str(tmp_path / name)]).verdict
        assert v.primary is not None and v.primary.who.rank == 3, (name, v.summary)


# c10d's ProcessGroupNCCL lines as torch 2.4-2.13 print them (ProcessGroupNCCL.cpp: the watchdog's exception
# handler; "[PG ID 0 PG GUID 0(default_pg) Rank N]" is the logPrefix of the default group); the traceback is
# what a rank prints for the same error; no GPU here to make them
_C10D = ("[E1128 03:14:07.123456 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank 3] Process group "
         "watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered\n")
_TRACEBACK = ("Traceback (most recent call last):\n"
              '  File "/job/train.py", line 88, in <module>\n'
              "    loss = model(batch).sum()\n"
              "RuntimeError: CUDA error: an illegal memory access was encountered\n")


def test_a_hardware_error_belongs_to_the_rank_whose_process_group_names_it(tmp_path: Path) -> None:
    """Rule 5: an unlabelled CUDA error traceback and a ``[... Rank 3]`` line of the same error are rank 3's; a
    line of another process group (its rank is that group's own) names no global rank."""
    path = tmp_path / "console.log"
    path.write_text("step 10\n" + _TRACEBACK + _C10D)
    v = triage([str(path)]).verdict
    assert v.primary is not None and v.primary.who.rank == 3, v.summary
    other = tmp_path / "other-group.log"
    other.write_text("step 10\n" + _TRACEBACK + _C10D.replace("PG ID 0 PG GUID 0(default_pg)", "PG ID 2 PG GUID 5"))
    v = triage([str(other)]).verdict
    assert v.primary is not None and v.primary.who.rank is None, v.summary


def test_nccl_slow_path_stays_a_finding_quoted_or_flattened(tmp_path: Path) -> None:
    """Rule 7: NCCL's "NET/IB : No device found" and sockets between nodes are findings of a log without a
    crash, pasted as it is, quoted once or twice, or with its lines flattened onto one."""
    text = (REPO / "tests" / "data" / "logs" / "nccl_old_format.log").read_text()
    pastes = {"as-is": text, "quoted": _quoted(text), "quoted-twice": _quoted(_quoted(text)),
              "flattened": " ".join(text.splitlines()) + "\n"}
    for name, paste in pastes.items():
        path = tmp_path / f"{name}.log"
        path.write_text(paste)
        report = triage([str(path)])
        assert report.ok and report.verdict.status == "none", (name, report.verdict.summary)
        findings = " ".join(str(f) for f in (report.nccl or {}).get("findings", []))
        assert "TCP sockets" in findings and "no InfiniBand device found" in findings, (name, report.nccl)
    # torch's NCCL error names NCCL's version at the end of its message: one line, not two flattened
    path = tmp_path / "error.log"
    path.write_text("[rank3]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3763, remote "
                    "process exited or there was a network error, NCCL version 2.28.8\n")
    report = triage([str(path)])
    assert report.sources[0].repairs == [] and report.verdict.secondary, (report.sources[0].repairs, report.verdict)



def test_a_pods_console_is_its_node_and_its_agent_names_the_ranks(tmp_path: Path) -> None:
    """Rule 6: ``kubectl logs trainjob-worker-0 > trainjob-worker-0.log`` (a PyTorchJob's pod): the pod is the node,
    and its agent's ``global_ranks=[2, 3]`` and failed line name rank 3 (the console of a real agent, saved under
    a pod's name, cut after its failed line)."""
    text = (DATA / "agent1.log").read_text()
    path = tmp_path / "trainjob-worker-0.log"
    path.write_text(text[:text.index("\n", text.index("failed (exitcode: 1)")) + 1])
    v = triage([str(path)]).verdict
    assert v.primary is not None and v.primary.who.rank == 3 and v.primary.who.node == "trainjob-worker-0", v.summary


def test_a_sigabrt_after_the_watchdog_took_the_process_down_is_its_abort(tmp_path: Path) -> None:
    """c10d's watchdog (ProcessGroupNCCL.cpp) says it takes the process down and aborts it; torchrun then reports
    exit code -6: the abort of a rank whose collective timed out, a consequence, not a crash of its own. A SIGABRT
    with no watchdog before it stays a crash."""
    dog = ("[E ProcessGroupNCCL.cpp:828] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4, "
           "OpType=ALLGATHER, Timeout(ms)=1800000) ran for 1800081 milliseconds before timing out.\n"
           "[E ProcessGroupNCCL.cpp:460] To avoid data inconsistency, we are taking the entire process down.\n"
           "terminate called after throwing an instance of 'std::runtime_error'\n")
    failed = ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -6) local_rank: 0 (pid: 95313) of "
              "binary: /usr/bin/python3\n")
    path = tmp_path / "agent.log"
    path.write_text(dog + failed)
    report = triage([str(path)])
    assert report.verdict.status == "secondary-only", report.verdict.summary
    (abort,) = [e for e in report.events if e.detail.get("exit_code") == -6]
    assert "watchdog" in abort.detail["abort_by"] and not abort.strong, abort
    path.write_text(failed)
    v = triage([str(path)]).verdict
    assert v.status == "failure" and v.primary is not None and "SIGABRT" in v.primary.message, v.summary
