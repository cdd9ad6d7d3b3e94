"""`mldebug logs` on every launcher's own console: real logs, and line shapes from the launchers' source.

The real logs (tests/data/logs_corpus/*.log) were written by the launchers themselves on this machine by
tests/data/logs_corpus/make_corpus.py (torch 2.13 torchrun, DeepSpeed 0.19.8's per-node launcher,
Accelerate 1.15 (its multi-process and its one-process launcher), Lightning 2.6, torch.multiprocessing.spawn, Open MPI 4.1 mpirun --tag-output, pdsh 2.34 -R exec, the rig's Slurm
srun with and without --label, srun --label over one torchrun agent per node). No job runs here.

Where a launcher's older line shapes cannot be produced here, the lines are written as its source
writes them; each case names the file and version.
"""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from ml_debug.logs.render import render
from ml_debug.logs.result import PRIMARY, SECONDARY, TIME_LAUNCHER, TIME_NEARBY
from ml_debug.logs.triage import triage
from ml_debug.page.timeline import timeline_html
from tests.conftest import REPO
from tests.unit.logs.test_steps import RAY_CUT

CORPUS = REPO / "tests" / "data" / "logs_corpus"

# file: (rank, message in the first failure, launchers said, node or None)
REAL = {
    "torchrun-agent1.log": (3, "ValueError: bad batch on rank 3", ["torchrun"], None),
    "torchrun-segv.log": (2, "crashed with SIGSEGV", ["torchrun"], None),
    "torchrun-oom.log": (1, "OutOfMemoryError: CUDA out of memory", ["torchrun"], None),
    "torchrun-bus.log": (1, "Bus error", ["torchrun"], None),
    "accelerate.log": (1, "ValueError: bad batch on rank 1", ["accelerate", "torchrun"], None),
    "accelerate-killed.log": (0, "killed by SIGKILL", ["accelerate"], None),
    "deepspeed.log": (1, "crashed with SIGSEGV", ["deepspeed"], None),
    "lightning.log": (1, "ValueError: bad batch on rank 1", ["lightning"], None),
    "mpirun.log": (2, "ValueError: bad batch on rank 2", ["mpirun"], None),
    "pdsh.log": (1, "ValueError: bad batch on rank 1", ["pdsh"], "n2"),
    "srun-label.log": (2, "ValueError: bad batch on rank 2", ["srun"], "node2"),
    "srun-nolabel.log": (2, "ValueError: bad batch on rank 2", ["srun"], "node2"),
    "srun-torchrun.log": (3, "ValueError: bad batch on rank 3", ["torchrun", "srun"], "node2"),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_each_launchers_real_console_names_the_failing_rank(name: str) -> None:
    rank, message, launchers, node = REAL[name]
    r = triage([str(CORPUS / name)])
    v = r.verdict
    assert v.status == "failure" and v.primary is not None, v.summary
    assert v.primary.who.rank == rank and message in v.primary.message, v.summary
    assert v.summary.startswith(f"first failure: rank {rank}"), v.summary
    assert r.launchers == launchers, r.launchers
    if name == "srun-torchrun.log":  # srun --label over one agent per node: the tasks are agents, named by host
        assert r.sources[0].view == "2 torchrun agents: ranks 0-3 on node1, node2", r.sources[0].view
    if node:
        assert v.primary.who.node == node, v.primary.who
    assert v.confidence in ("high", "medium") and v.confidence_why


def test_the_first_failure_says_where_the_jobs_own_code_raised_it(tmp_path: Path) -> None:
    """The last frame of the job's own code (not under site-packages, nor the standard library's): where to look
    first. A traceback all in libraries says none."""
    r = triage([str(CORPUS / "mpirun.log")])
    assert r.verdict.primary is not None
    assert r.verdict.primary.detail["raised_in"].endswith("logs_corpus/worker.py:58, in main"), r.verdict.primary.detail
    out = io.StringIO()
    render(r, Console(file=out, width=300))
    assert "; raised in " in out.getvalue() and "worker.py:58, in main" in out.getvalue(), out.getvalue()
    libraries = ('Traceback (most recent call last):\n  File "/usr/lib/python3.10/runpy.py", line 196, in _run_module_as_main\n'
                 '  File "/opt/venv/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1518, in _call_impl\n'
                 "RuntimeError: boom\n")
    # (the wrapper pip writes for a package's command is the package's: accelerate's, torchrun's)
    libraries = libraries.replace("Traceback (most recent call last):\n", 'Traceback (most recent call last):\n  File '
                                  '"/home/me/miniconda3/envs/x/bin/accelerate", line 8, in <module>\n    sys.exit(main())\n')
    v = triage([_write(tmp_path, libraries)]).verdict
    assert v.primary is not None and "raised_in" not in v.primary.detail, v.primary.detail
    # torchelastic's error file alone (its traceback in the message's extraInfo)
    error_file = next((REPO / "tests" / "data" / "logs" / "launch_nan_rank1_stopped_first").rglob("error.json"))
    v = triage([str(error_file)]).verdict
    assert v.primary is not None and v.primary.kind == "error-file", v.primary
    assert v.primary.detail["raised_in"].endswith("ml_debug/train/trainer.py:253, in _fail_if_not_finite"), v.primary.detail


def test_deepspeed_return_code_is_the_fact_not_its_command_line() -> None:
    """DeepSpeed's sigkill_handler line names the command of the last rank it started; the rank that died is
    the one that left nothing else (the others say their peer closed the connection)."""
    text = (CORPUS / "deepspeed.log").read_text()
    assert "exits with return code = -11" in text
    v = triage([str(CORPUS / "deepspeed.log")]).verdict
    assert v.primary is not None and v.primary.detail["exit_code"] == -11 and v.primary.detail["via"] == "deepspeed"
    assert "only rank of the job that reported no failure" in v.primary.detail["rank_from"]
    assert v.confidence == "medium" and not v.independent, v.summary
    assert "SIGSEGV" in (v.hint or "")


def test_a_time_that_only_bounds_the_failure_is_said_so_and_a_placed_rank_is_named_everywhere() -> None:
    """DeepSpeed reports rank 1's SIGSEGV at 04:22:32, after its peers lost the connection (at 04:22:15, the
    time of a line before their tracebacks): the verdict says the crash was *reported* then, and the timeline
    marks both times as bounds. The rank placed by elimination is rank 1 in the timeline and the events too."""
    report = triage([str(CORPUS / "deepspeed.log")])
    v = report.verdict
    assert v.primary is not None and v.primary.time_source == TIME_LAUNCHER, v.primary
    assert v.summary.startswith("first failure: rank 1, reported at "), v.summary
    assert v.basis == "the only primary failure (time from the launcher's report of the exit)", v.basis
    rows = {row.cls: row for row in report.timeline}
    assert rows[PRIMARY].ranks == "1" and rows[PRIMARY].who == "", rows
    assert (rows[PRIMARY].time_source, rows[SECONDARY].time_source) == (TIME_LAUNCHER, TIME_NEARBY)
    crash = [e for e in report.events if e.kind == "signal"]
    assert [e.who.rank for e in crash] == [1] and "rank_from" in crash[0].detail, crash
    console = Console(file=io.StringIO(), width=200, color_system=None)
    render(report, console)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    crash_row = next(ln for ln in out.splitlines() if "crashed with SIGSEGV" in ln and "primary" in ln)
    reset_row = next(ln for ln in out.splitlines() if "Connection closed by peer" in ln and "│ after" in ln)
    assert crash_row.startswith("≤04:22:32 ") and reset_row.startswith("≥04:22:15 "), out
    assert "  ≤ when a launcher reported it (it happened no later); ≥ the time of a line before it" in out, out
    page = timeline_html(report)
    assert "≤04:22:32." in page and "≥04:22:15." in page and "≤ when a launcher reported it" in page, page


def test_two_torchrun_agents_each_give_one_nodes_view() -> None:
    """--nnodes 2: agent 0's console holds only its ranks' consequences; agent 1's holds rank 3's error."""
    alone = triage([str(CORPUS / "torchrun-agent0.log")]).verdict
    assert alone.status == "secondary-only" and alone.confidence == "low", alone.summary
    both = triage([str(CORPUS / "torchrun-agent0.log"), str(CORPUS / "torchrun-agent1.log")])
    assert both.verdict.primary is not None and both.verdict.primary.who.rank == 3, both.verdict.summary
    assert [s.view for s in both.sources] == ["one torchrun agent's view: ranks 0-1", "one torchrun agent's view: ranks 2-3"]


def test_bus_error_and_oom_come_with_their_next_step() -> None:
    bus = triage([str(CORPUS / "torchrun-bus.log")]).verdict
    assert bus.hint is not None and "/dev/shm" in bus.hint and "--shm-size" in bus.hint
    oom = triage([str(CORPUS / "torchrun-oom.log")]).verdict
    assert oom.hint is not None and oom.hint.startswith("rank 1 (GPU 1) ran out of memory")


# ----------------------------------------------------------------------------- line shapes from the source

def _write(tmp: Path, text: str, name: str = "job.log") -> str:
    path = tmp / name
    path.write_text(text)
    return str(path)


# torch/distributed/elastic/multiprocessing/api.py, log.error(f"failed (exitcode: ...) local_rank: ... (pid: ...) of
# binary: ..."), through three loggers: torch 1.10-1.13 (logging's default "LEVEL:name:msg"), torch 2.0-2.1
# (torch/distributed/elastic/utils/logging.py: "[time] name: [LEVEL] msg"), torch 2.2+ (glog style, as the real
# corpus shows).
AGENT_LINES = {
    "torch-1.10": "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 3 (pid: 4242) "
                  "of binary: /usr/bin/python3",
    "torch-2.1": "[2024-05-01 03:14:07,123] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1) "
                 "local_rank: 3 (pid: 4242) of binary: /usr/bin/python3",
    "torch-2.4": "E0501 03:14:07.123000 140213 torch/distributed/elastic/multiprocessing/api.py:833] failed "
                 "(exitcode: 1) local_rank: 3 (pid: 4242) of binary: /usr/bin/python3",
}


@pytest.mark.parametrize("shape", sorted(AGENT_LINES))
def test_torchrun_agent_line_alone_names_a_local_rank_not_a_rank(tmp_path: Path, shape: str) -> None:
    """One agent's line, nothing else: it names local rank 3 of a node it does not name."""
    r = triage([_write(tmp_path, "[default3]:step 10\n" + AGENT_LINES[shape] + "\n")])
    v = r.verdict
    assert v.primary is not None and v.primary.who.rank is None and v.primary.who.local_rank == 3, v.summary
    assert v.summary.startswith("first failure: local rank 3 on unknown node"), v.summary
    assert "rank 3 " not in v.summary.replace("local rank 3 ", "")
    assert r.launchers == ["torchrun"] and v.confidence == "medium"


def test_a_cut_torchrun_line_still_says_the_exit_code(tmp_path: Path) -> None:
    cut = AGENT_LINES["torch-1.10"][:AGENT_LINES["torch-1.10"].index("local_rank") + 5]
    v = triage([_write(tmp_path, cut)]).verdict  # no newline at the end either
    assert v.status == "failure" and v.primary is not None and v.primary.detail["exit_code"] == 1, v.summary
    assert "cut" in v.primary.detail


def test_several_agents_under_srun_label_are_told_apart(tmp_path: Path) -> None:
    """srun --label over one torchrun agent per node: the task is the agent, and local rank 1 of task 0 is not
    local rank 1 of task 1."""
    text = ("0: [default1]:step 5\n1: [default1]:step 5\n"
            "1: " + AGENT_LINES["torch-2.4"].replace("local_rank: 3", "local_rank: 1") + "\n")
    v = triage([_write(tmp_path, text)]).verdict
    assert v.primary is not None and v.primary.who.local_rank == 1, v.summary
    assert v.primary.who.node == "node of srun task 1", v.primary.who
    assert "local rank 1 on node of srun task 1" in v.summary


def test_torchrun_summary_pasted_alone_with_its_indentation_stripped(tmp_path: Path) -> None:
    """torch/distributed/elastic/multiprocessing/errors/__init__.py (ChildFailedError.format_msg), torch 2.x, as
    pasted into an issue: no traceback before it, no indentation."""
    text = """============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
time      : 2024-05-01_03:14:09
host      : node7
rank      : 12 (local_rank: 4)
exitcode  : -15 (pid: 11)
error_file: <N/A>
traceback : Signal 15 (SIGTERM) received by PID 11
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
time      : 2024-05-01_03:14:07
host      : node7
rank      : 13 (local_rank: 5)
exitcode  : -9 (pid: 12)
error_file: <N/A>
traceback : Signal 9 (SIGKILL) received by PID 12
============================================================
"""
    v = triage([_write(tmp_path, text)]).verdict
    assert v.primary is not None and v.primary.who.rank == 13 and v.primary.who.node == "node7", v.summary
    assert "SIGKILL" in v.primary.message


def test_two_ranks_in_the_same_second_are_a_tie(tmp_path: Path) -> None:
    """torchrun's summary knows times to the second: two ranks failing then are a tie, not a culprit."""
    text = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2024-05-01_03:14:07
  host      : node7
  rank      : 5 (local_rank: 1)
  exitcode  : -6 (pid: 11)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 11
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-05-01_03:14:07
  host      : node7
  rank      : 4 (local_rank: 0)
  exitcode  : -11 (pid: 12)
  error_file: <N/A>
  traceback : Signal 11 (SIGSEGV) received by PID 12
============================================================
"""
    v = triage([_write(tmp_path, text)]).verdict
    assert v.tie == "4-5" and v.confidence == "low", v.summary
    assert v.summary.startswith("tie: rank 4 (node7), rank 5 (node7) failed in the same second"), v.summary


# Open MPI 5 (prte: src/prted/help-prterun.txt "prterun detected that one or more processes exited with non-zero
# status ... Process name: [prterun-host-1234@1,2]") and Open MPI 4 orterun's signal message
# (orte/tools/orterun/help-orterun.txt "mpirun noticed that process rank %d with PID %d on node %s exited on signal").
def test_open_mpi_5_and_signal_messages(tmp_path: Path) -> None:
    prte = ("[1,0]<stdout>:step 1\n[1,2]<stdout>:step 1\n"
            "prterun detected that one or more processes exited with non-zero status,\nthus causing the job to be "
            "terminated. The first process to do so was:\n\n   Process name: [prterun-vm-4242@1,2]\n"
            "   Exit code:    3\n")
    v = triage([_write(tmp_path, prte, "prte.log")]).verdict
    assert v.primary is not None and v.primary.who.rank == 2 and v.primary.detail["via"] == "mpirun", v.summary
    sig = "mpirun noticed that process rank 5 with PID 777 on node gpu03 exited on signal 11 (Segmentation fault).\n"
    v = triage([_write(tmp_path, sig, "orte.log")]).verdict
    assert v.primary is not None and v.primary.who.rank == 5 and v.primary.who.node == "gpu03", v.summary


# horovodrun's gloo runner (horovod/runner/gloo_run.py): each worker's lines after "[rank]<stream>:"
# (common/util/safe_shell_exec.py), "Process 1 exit with status code 1." per process, then its own traceback whose
# RuntimeError names the first process to exit non-zero ("Process name: 1": its rank) and its exit code.
_HOROVOD_FIRST = ("RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing "
                  "the job to be terminated. The first process to do so was:")
_HOROVOD_TRACEBACK = ('Traceback (most recent call last):\n  File "/usr/local/bin/horovodrun", line 8, in <module>\n'
                      "    sys.exit(run_commandline())\n"
                      '  File "/usr/lib/python3/dist-packages/horovod/runner/gloo_run.py", line 284, in launch_gloo\n'
                      "    raise RuntimeError('Horovod detected that one or more processes exited with non-zero '\n"
                      f"{_HOROVOD_FIRST}\nProcess name: 2\nExit code: 1\n")


@pytest.mark.parametrize("text, summary", [
    # the worker's own traceback under its label, then horovodrun's accounting: the worker's error is the failure
    ("[0]<stdout>:step 10 loss 2.31\n[2]<stderr>:Traceback (most recent call last):\n"
     '[2]<stderr>:  File "train.py", line 40, in <module>\n[2]<stderr>:ValueError: bad batch 17\n'
     "Process 2 exit with status code 1.\nProcess 0 exit with status code 1.\n" + _HOROVOD_TRACEBACK,
     "first failure: rank 2: ValueError: bad batch 17"),
    # horovodrun's traceback alone: its RuntimeError names the rank
    (_HOROVOD_TRACEBACK, "first failure: rank 2: exited with code 1"),
    # its exception pasted without its traceback, under a log shipper's prefix that sorted its two lines
    (f"[10:43:01] 087c || {_HOROVOD_FIRST}\n[10:43:01] 087c || Exit code: 1\n[10:43:01] 087c || Process name: 2\n",
     "first failure: rank 2, reported at 10:43:01: exited with code 1"),
])
def test_horovodruns_accounting_names_the_rank(tmp_path: Path, text: str, summary: str) -> None:
    v = triage([_write(tmp_path, text)]).verdict
    assert v.status == "failure" and v.summary.startswith(summary), v.summary
    assert v.primary is not None and v.primary.who.rank == 2


# NCCL src/misc/shmutils.cc (2.12-2.21): "Error while creating shared memory segment %s (size %zu)" after
# "failed to extend"; src/misc/ibvwrap.cc: "Failed to open libibverbs.so[.1]" (WARN before 2.12, INFO after).
def test_nccl_shared_memory_segment_failure_is_the_cause(tmp_path: Path) -> None:
    text = ("[rank0]:[W501 03:14:05] step 0\n"
            "3d3e22c3066f:168:168 [0] misc/shmutils.cc:72 NCCL WARN Error: failed to extend /dev/shm/nccl-UbzKZ9 to "
            "9637892 bytes\n"
            "3d3e22c3066f:168:168 [0] misc/shmutils.cc:113 NCCL WARN Error while creating shared memory segment "
            "/dev/shm/nccl-UbzKZ9 (size 9637888)\n")
    v = triage([_write(tmp_path, text)]).verdict
    assert v.status == "failure" and v.primary is not None and v.primary.kind == "shm", v.summary
    assert v.hint is not None and "--shm-size" in v.hint and "NCCL_SHM_DISABLE=1" in v.hint


def test_nccl_socket_fallback_without_libibverbs_is_a_finding(tmp_path: Path) -> None:
    text = ("gpu1:58239:58245 [0] NCCL INFO Failed to open libibverbs.so[.1]\n"
            "gpu1:58239:58245 [0] NCCL INFO NET/Socket : Using [0]eth0:172.26.190.235<0>\n"
            "gpu1:58239:58245 [0] NCCL INFO Using network Socket\n")
    v = triage([_write(tmp_path, text)]).verdict
    assert v.status == "none" and v.findings, v
    assert "libibverbs" in v.findings[0] and "NCCL_IB_HCA" in v.findings[0]


def test_lines_that_only_look_like_a_failure_are_never_no_failure_found(tmp_path: Path) -> None:
    text = "step 1 loss 2.1\n[2024-05-01 03:14:07] ERROR trainer: checkpoint upload to s3 failed, giving up\n"
    v = triage([_write(tmp_path, text)]).verdict
    assert v.status == "suspect" and v.failed and v.confidence == "low", v.summary
    assert v.primary is not None and "checkpoint upload" in v.primary.message
    clean = triage([_write(tmp_path, "step 1 loss 2.1\nvalidation: 0 errors\n/x/torchvision/io/image.py:13: UserWarning: "
                           "Failed to load image Python extension\n", "clean.log")]).verdict
    assert clean.status == "none" and clean.summary == "no failure found"


def test_an_oom_without_a_rank_prefix_is_put_on_the_rank_whose_peers_name_themselves(tmp_path: Path) -> None:
    """CUDA's OOM printed without a prefix; the watchdog lines of the other ranks say who they are."""
    text = "".join(f"[rank{r}]:[E501 03:14:{10 + r}.000000 ProcessGroupNCCL.cpp:1595] [PG 0 Rank {r}] Watchdog caught "
                   f"collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                   f"Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n" for r in (0, 1, 3))
    text = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 2 has a total capacity of "
            "79.15 GiB of which 1.02 GiB is free.\n") + text
    v = triage([_write(tmp_path, text)]).verdict
    assert v.primary is not None and v.primary.kind == "oom" and v.primary.who.rank == 2, v.summary
    assert v.hint is not None and "(GPU 2)" in v.hint and v.primary.cls == PRIMARY


def test_old_style_watchdog_lines_and_a_harness_prefix(tmp_path: Path) -> None:
    """c10d before torch 2.2 (ProcessGroupNCCL.cpp: "[E ProcessGroupNCCL.cpp:475] [Rank 3] Watchdog caught collective
    operation timeout: WorkNCCL(..., Timeout(ms)=1800000) ran for ..."), no line prefix; the failing rank's lines
    come through a harness that writes "<job>.<node> [stderr] " before torch's [rankN]:."""
    watchdog = "".join(f"[E ProcessGroupNCCL.cpp:475] [Rank {r}] Watchdog caught collective operation timeout: "
                       f"WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for "
                       f"18003{r}1 milliseconds before timing out.\n" for r in (3, 1, 0))
    culprit = ("bench-77.gpu-node-2 [stderr] [rank2]: Traceback (most recent call last):\n"
               "bench-77.gpu-node-2 [stderr] [rank2]:   File \"train.py\", line 3, in <module>\n"
               "bench-77.gpu-node-2 [stderr] [rank2]: RuntimeError: CUDA error: an illegal memory access was "
               "encountered\n")
    v = triage([_write(tmp_path, watchdog + culprit)]).verdict
    assert v.primary is not None and (v.primary.who.rank, v.primary.who.node) == (2, "gpu-node-2"), v.summary
    assert v.secondary and v.secondary[0]["label"] == "NCCL watchdog timeout" and v.secondary[0]["ranks"] == "0-1,3"


def test_kubectl_time_stamps_before_the_launchers_labels(tmp_path: Path) -> None:
    text = ("2024-05-01T03:14:05.100000000Z [default0]:step 9\n"
            "2024-05-01T03:14:07.123456789Z [default1]:[rank1]: Traceback (most recent call last):\n"
            "2024-05-01T03:14:07.123456789Z [default1]:[rank1]:   File \"train.py\", line 3, in <module>\n"
            "2024-05-01T03:14:07.123456789Z [default1]:[rank1]: ValueError: bad batch\n"
            "2024-05-01T03:14:08.000000000Z [default0]:[rank0]: RuntimeError: Connection closed by peer [10.0.0.1]:99\n")
    v = triage([_write(tmp_path, text)]).verdict
    assert v.primary is not None and v.primary.who.rank == 1 and v.primary.message == "ValueError: bad batch"
    assert v.primary.time is not None and v.primary.time_source == "line"


def test_torch_1_10_failure_summary(tmp_path: Path) -> None:
    """torch 1.10's ChildFailedError format (torch/distributed/elastic/multiprocessing/errors/__init__.py): 'Root
    Cause:' first, fields without padding, 'msg:' instead of 'traceback:', starred borders."""
    text = (AGENT_LINES["torch-1.10"] + "\nTraceback (most recent call last):\n"
            '  File "/usr/lib/python3.8/runpy.py", line 194, in _run_module_as_main\n'
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            "***************************************\n              train.py FAILED           \n"
            "=======================================\nRoot Cause:\n[0]:\n  time: 2021-11-02_10:11:12\n"
            "  rank: 3 (local_rank: 3)\n  exitcode: 1 (pid: 4242)\n  error_file: <N/A>\n"
            '  msg: "Process failed with exitcode 1"\n=======================================\nOther Failures:\n'
            "  <NO_OTHER_FAILURES>\n***************************************\n")
    v = triage([_write(tmp_path, text)]).verdict
    assert v.primary is not None and v.primary.who.rank == 3 and v.primary.detail["exit_code"] == 1, v.summary


def _summary_of(text: str, drop: tuple[int, ...] = ()) -> str:
    """torchrun's failure summary cut out of a console (what users paste), without the entries ``drop``."""
    summary = text[text.index("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"):]
    for i in drop:
        start = summary.index(f"[{i}]:\n")
        summary = summary[:start] + summary[summary.index("  traceback", start):].split("\n", 1)[1]
    return summary


def test_every_rank_in_the_same_second_is_a_tie_and_torchruns_root_cause_is_its_own_pick(tmp_path: Path) -> None:
    """Four ranks raise at the same step; torchrun's agent (looking every 5 s, as torch 1.x did) lists every exit in
    the same second and names the lowest rank its root cause: a tie, whose order only the ranks' own lines can say.
    Pasted alone, the summary's entries come in rank order: its root cause is the one named, never 'failed after'."""
    console = (CORPUS / "torchrun-every-rank.log").read_text()
    r = triage([str(CORPUS / "torchrun-every-rank.log")])
    v = r.verdict
    assert v.tie == "0-3" and v.confidence == "low" and v.primary is not None, v.summary
    first = v.primary.who.rank
    assert v.summary.startswith("tie: ranks 0-3 failed in the same second, reported at "), v.summary
    assert (f"which came first is not known (the first in the logs: rank {first}; torchrun's 'Root Cause' picks "
            "rank 0): ValueError: bad batch on rank") in v.summary, v.summary
    assert console.index(f"[rank{first}]: Traceback") == min(console.index(f"[rank{k}]: Traceback") for k in range(4))

    for drop, ranks in (((), "0-3"), ((2, 3), "0-1")):  # all four entries; one failure and the root cause
        report = triage([_write(tmp_path, _summary_of(console, drop), f"summary-{ranks}.log")])
        v = report.verdict
        assert v.primary is not None and v.primary.who.rank == 0 and v.tie == ranks, v.summary
        assert v.summary.startswith(f"tie: ranks {ranks} failed in the same second, reported at "), v.summary
        assert v.summary.endswith("(torchrun's 'Root Cause' picks rank 0): exited with code 1"), v.summary
        assert "after it" not in v.summary and v.silent_ranks is None, v.summary
        # four lines of one length (each entry's traceback hint) are no terminal's wrapping
        assert report.sources[0].repairs == [], report.sources[0].repairs


def test_a_launchers_report_of_its_childs_signal_after_an_info_line_is_the_failure(tmp_path: Path) -> None:
    """DeepSpeed before 0.6 (deepspeed/launcher/launch.py sigkill_handler) logs 'Killing subprocess' at INFO for
    each rank, then raises its last child's exit as a CalledProcessError: a failure, not a traceback the program
    logged and survived. A wrapper script's CalledProcessError logged at WARNING stays a handled one."""
    cmd = ["/usr/bin/python", "-u", "train.py", "--local_rank=7"]
    frames = ('  File "/opt/conda/lib/python3.8/site-packages/deepspeed/launcher/launch.py", line 131, in '
              "sigkill_handler\n    raise subprocess.CalledProcessError(returncode=last_return_code, cmd=cmd)\n")
    for code, kind, said in ((-9, "signal", "killed by SIGKILL"), (1, "exit", "CalledProcessError")):
        text = "".join(f"[2021-11-21 08:32:07,150] [INFO] [launch.py:131:sigkill_handler] Killing subprocess {pid}\n"
                       for pid in (250621, 250622))
        text += (f"Traceback (most recent call last):\n{frames}"
                 f"subprocess.CalledProcessError: {subprocess.CalledProcessError(code, cmd)}\n")
        r = triage([_write(tmp_path, text, f"ds-{code}.log")])
        v = r.verdict
        assert v.status == "failure" and v.primary is not None, v.summary
        assert v.primary.kind == kind and v.primary.detail["exit_code"] == code and said in v.primary.message, v
        assert "handled" not in v.primary.detail and r.launchers == ["deepspeed"], (v.primary.detail, r.launchers)
    wrapper = ("2021-11-21 08:32:07,150 [WARNING] preprocessing failed, using the cached shards\n"
               'Traceback (most recent call last):\n  File "prep.py", line 9, in main\n'
               f"subprocess.CalledProcessError: {subprocess.CalledProcessError(-9, cmd)}\n"
               "2021-11-21 08:32:09,002 [INFO] step 1\n")
    v = triage([_write(tmp_path, wrapper, "wrapper.log")]).verdict
    assert v.status == "none", v.summary


def _entry(i: int, time: str, rank: int, code: int) -> str:
    """One entry of torchrun's failure summary (torch/distributed/elastic/multiprocessing/errors/__init__.py)."""
    hint = (f"Signal {-code} ({'SIGKILL' if code == -9 else 'SIGTERM'}) received by PID {100 + rank}" if code < 0
            else "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
    return (f"[{i}]:\n  time      : 2026-09-07_{time}\n  host      : localhost\n  rank      : {rank} (local_rank: "
            f"{rank})\n  exitcode  : {code} (pid: {100 + rank})\n  error_file: <N/A>\n  traceback : {hint}\n")


def test_a_bare_exit_code_a_second_or_more_before_a_kill_is_first(tmp_path: Path) -> None:
    """Rank 3 exited with code 1 at 13:02:58; rank 0 was killed 31 s later (torchrun's SIGKILL after its SIGTERM
    grace): the exit code came first, though a kill says more than a bare code. In the same second, it would not."""
    for later, first in (("13:03:29", 3), ("13:02:58", 0)):
        text = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n" + "=" * 40 + "\ntrain.py FAILED\n"
                + "-" * 40 + "\nFailures:\n" + _entry(1, later, 0, -9) + _entry(2, later, 2, -15) + "-" * 40
                + "\nRoot Cause (first observed failure):\n" + _entry(0, "13:02:58", 3, 1) + "=" * 40 + "\n")
        v = triage([_write(tmp_path, text)]).verdict
        assert v.primary is not None and v.primary.who.rank == first, v.summary
        assert ("1 other rank(s) failed on their own: rank 0: killed by SIGKILL" in v.summary) == (first == 3), v.summary


def test_a_traceback_cut_before_its_exception_is_not_sure(tmp_path: Path) -> None:
    text = ("[rank3]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting\n"
            "[rank2]: Traceback (most recent call last):\n[rank2]:   File \"/job/bench.py\", line 144, in <module>\n")
    v = triage([_write(tmp_path, text)]).verdict
    assert v.primary is not None and v.primary.who.rank == 2 and v.primary.message == "traceback (cut short)", v.summary
    assert v.confidence == "medium" and "ends before its exception" in v.confidence_why, v.confidence_why


def test_torchruns_own_traceback_cut_short_after_its_failure_line_is_the_launchers(tmp_path: Path) -> None:
    """A paste that ends in the traceback torchrun prints after its failure line, before any of its own frames."""
    text = ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 4 (pid: 24905) of "
            "binary: /usr/bin/python3\nTraceback (most recent call last):\n  File \"/usr/lib/python3.10/runpy.py\", "
            "line 196, in _run_module_as_main\n")
    v = triage([_write(tmp_path, text)]).verdict
    assert v.primary is not None and v.primary.who.local_rank == 4 and "SIGKILL" in v.primary.message, v.summary
    assert not v.independent and "(" not in v.summary.split("kill -9")[1], v.summary


def test_a_slurm_cancel_with_no_failure_before_it_is_a_stop_from_outside(tmp_path: Path) -> None:
    """slurmstepd's "CANCELLED" without "DUE TO" follows a failed task when srun stops the step (a consequence), or
    comes first when someone ran scancel or the scheduler stopped it: then it is the job's end, not a peer's echo."""
    cancel = "slurmstepd: error: *** STEP 6053.0 ON node7 CANCELLED AT 2024-04-23T12:18:08 ***\n"
    text = cancel + "srun: error: node7: task 0: Terminated\nsrun: Force Terminated StepId=6053.0\n"
    v = triage([_write(tmp_path, text)]).verdict
    assert v.status == "failure" and v.primary is not None and v.primary.kind == "slurm", v.summary
    assert "no task had failed before it" in v.summary and v.primary.who.rank is None, v.summary
    failed = "srun: error: node7: task 1: Exited with exit code 1\n" + cancel
    v = triage([_write(tmp_path, failed, "failed.log")]).verdict
    assert v.primary is not None and v.primary.who.rank == 1 and "no task had failed" not in v.summary, v.summary


def test_an_agent_stopped_from_outside_is_the_failure() -> None:
    """SIGTERM to torchrun (a scheduler's time limit, preemption, scancel): its agent says it got a death signal and
    stops its ranks. The job did not end by itself: not 'no failure', not only its own SignalException."""
    r = triage([str(CORPUS / "torchrun-stopped.log")])
    v = r.verdict
    assert v.status == "failure" and v.primary is not None and v.primary.detail["sig"] == 15, v.summary
    assert "the job was stopped from outside" in v.primary.message and r.launchers == ["torchrun"], v.summary
    assert v.summary.startswith("first failure: the job at "), v.summary  # the job's end, no rank's


@pytest.mark.parametrize(("text", "summary", "node"), [
    # Open MPI's signal handler (opal/util/stacktrace.c): its "[host:pid]" is no torchrun role's local rank
    ("[c4140-02:236649] *** Process received signal ***\n[c4140-02:236649] Signal: Segmentation fault (11)\n"
     "[c4140-02:236649] Signal code: Address not mapped (1)\n", "first failure: c4140-02: crashed with SIGSEGV",
     "c4140-02"),
    # kubectl get pods: a pod whose container keeps failing
    ("NAME                                 READY   STATUS             RESTARTS   AGE\n"
     "pytorchjob-example-82cjcqdz-master-0   0/2     CrashLoopBackOff   8          2m32s\n",
     "first failure: pytorchjob-example-82cjcqdz-master-0: CrashLoopBackOff (kubectl get pods)",
     "pytorchjob-example-82cjcqdz-master-0"),
    # Kubeflow training-operator's log (pkg/controller.v1/common/pod.go): the pod is the node
    ("1.7085078566441019e+09\tDEBUG\tevents\tPod: kubeflow.pytorch-simple-worker-0 exited with code 1\n",
     "first failure: pytorch-simple-worker-0: exited with code 1", "pytorch-simple-worker-0"),
    # Ray's raylet (src/ray/raylet/node_manager.cc), before a rank's NCCL error that follows from it
    ("(raylet) A worker died or was killed while executing a task by an unexpected system error. RayTask ID: ff7a "
     "Worker ID: 88ae Node ID: dae8 Worker IP address: 10.0.10.143 Worker port: 10002 Worker PID: 2147 Worker exit "
     "type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2.\n"
     "(RayWorkerWrapper pid=2150, ip=10.0.10.144) [rank1]: torch.distributed.DistBackendError: NCCL error in: "
     "ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, NCCL version 2.21.5\n",
     "first failure: 10.0.10.143: Ray: worker pid 2147 died by a system error", "10.0.10.143"),
])
def test_a_crash_said_by_another_programs_line_names_its_node(tmp_path: Path, text: str, summary: str,
                                                              node: str) -> None:
    v = triage([_write(tmp_path, text)]).verdict
    assert v.status == "failure" and v.primary is not None and v.summary.startswith(summary), v.summary
    assert v.primary.who.node == node and v.primary.who.local_rank is None, v.primary.who


def test_rays_re_raise_of_a_workers_exception_names_the_workers_exception_and_node(tmp_path: Path) -> None:
    """Ray re-raises a worker's exception in the driver (python/ray/exceptions.py): "RayTaskError(X): ray::f() (pid=,
    ip=)" lines, each followed by the frames of the actor it came through, the worker's own exception last. That is
    the failure, on the innermost wrapper's node; cut before it, the wrapper and its node are what is known."""
    wrapper = ("ray.exceptions.RayTaskError(DistBackendError): ray::_Inner.train() (pid=249, ip=10.0.0.78, actor_id=37a2, "
               "repr=TorchTrainer)\n  File \"/opt/ray/tune/trainable/trainable.py\", line 400, in train\n"
               "    raise skipped from exception_cause(skipped)\n")
    cut = wrapper + RAY_CUT.split("trainer.fit()\n", 1)[1]
    whole = (cut + "    raise skipped from exception_cause(skipped)\n  File \"/job/train.py\", line 40, in train_func\n"
             "    dist.all_reduce(t)\n"
             "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error "
             "(run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\n")
    v = triage([_write(tmp_path, RAY_CUT.split("ray.exceptions", 1)[0] + whole)]).verdict
    assert v.primary is not None and v.summary.startswith("first failure: 10.0.0.19: DistBackendError: NCCL error in"), v.summary
    assert v.primary.detail["raised_in"] == "/job/train.py:40, in train_func" and v.hint and "NCCL_DEBUG=INFO" in v.hint
    v = triage([_write(tmp_path, RAY_CUT.split("ray.exceptions", 1)[0] + cut)]).verdict
    assert v.primary is not None and v.primary.who.node == "10.0.0.19", v.primary.who
    assert v.primary.message.startswith("ray.exceptions.RayTaskError(DistBackendError)") and "worker-*.err" in (v.hint or "")


def test_a_launchers_called_process_error_is_not_the_cause(tmp_path: Path) -> None:
    """accelerate/commands/launch.py (simple_launcher) re-raises its child's exit as subprocess.CalledProcessError,
    after the child's own traceback: the child's exception is the cause."""
    text = ("[rank0]: Traceback (most recent call last):\n[rank0]:   File \"train.py\", line 9, in <module>\n"
            "[rank0]: KeyError: 'labels'\n"
            "Traceback (most recent call last):\n  File \"/usr/bin/accelerate\", line 8, in <module>\n"
            "  File \"/usr/lib/python3/site-packages/accelerate/commands/launch.py\", line 1168, in simple_launcher\n"
            "subprocess.CalledProcessError: Command '['/usr/bin/python3', 'train.py']' returned non-zero exit status 1.\n")
    r = triage([_write(tmp_path, text)])
    assert r.verdict.primary is not None and r.verdict.primary.message == "KeyError: 'labels'", r.verdict.summary
    assert r.launchers == ["accelerate"]



def test_an_nccl_line_glued_onto_a_progress_bar(tmp_path: Path) -> None:
    bar = "Epoch 1:  12%|█▏        | 12/100 [00:01<00:08, 10.50it/s]"
    text = (f"{bar}gpu1:168:168 [0] misc/shmutils.cc:113 NCCL WARN Error while creating shared memory segment "
            "/dev/shm/nccl-UbzKZ9 (size 9637888), error: No space left on device (28)\n")
    r = triage([_write(tmp_path, text)])
    assert r.verdict.primary is not None and r.verdict.primary.kind == "shm", r.verdict.summary
    assert r.sources[0].repairs == ["progress bar cut off 1 line(s)"]


def test_pdsh_node_names_select_a_nodes_lines() -> None:
    from ml_debug.logs.triage import demux

    got: list[str] = []
    demux([str(CORPUS / "pdsh.log")], rank=None, node="n2", emit=lambda src, n, text: got.append(text))
    assert got and got[0] == "rank 1: step 1 done (sum 2)" and "ValueError: bad batch on rank 1: shape mismatch" in got


def test_a_suspect_line_takes_the_time_stamp_before_its_labels(tmp_path: Path) -> None:
    """kubectl logs --timestamps before torch's ``[rankN]:``: a line that only looks like a failure is timed by the
    stamp, as a known failure line is, so the earlier of two ranks' suspects is the first (not the first file's)."""
    (tmp_path / "rank0.log").write_text("2024-05-01T03:14:05.000000000Z [rank0]: step 9\n"
                                        "2024-05-01T03:14:09.000000000Z [rank0]: ERROR the data loader stopped\n")
    (tmp_path / "rank1.log").write_text("2024-05-01T03:14:05.000000000Z [rank1]: step 9\n"
                                        "2024-05-01T03:14:07.000000000Z [rank1]: ERROR the data loader stopped\n")
    v = triage([str(tmp_path)]).verdict
    assert v.status == "suspect" and v.primary is not None, v.summary
    assert v.primary.who.rank == 1 and v.primary.time_source == "line", v.summary


# (file, local rank, the first failure's message, how the local rank is known)
SPAWNED = [
    ("spawn-raise.log", 2, "ValueError: bad batch on process 2: shape mismatch", None),
    ("spawn-segv.log", 2, "crashed with SIGSEGV", "mp.spawn's report of its process 2"),
]


@pytest.mark.parametrize(("name", "local", "message", "rank_by"), SPAWNED)
def test_mp_spawns_report_names_the_process_and_its_own_traceback_is_no_failure(
        name: str, local: int, message: str, rank_by: str | None) -> None:
    """torch.multiprocessing.spawn's traceback from join() is its report, like torchrun's: the process it names
    (its index, a local rank) failed; "-- Process 2 terminated with the following error:" gives the traceback
    after it to that process."""
    r = triage([str(CORPUS / name)])
    v = r.verdict
    assert v.status == "failure" and v.primary is not None, v.summary
    assert (v.primary.who.rank, v.primary.who.local_rank) == (None, local), v.primary.who
    assert v.summary.startswith(f"first failure: local rank {local} on unknown node") and message in v.summary, v.summary
    assert v.primary.detail.get("rank_by") == rank_by, v.primary.detail
    assert r.launchers == ["mp.spawn"], r.launchers
    assert not v.independent and "failed after it" not in v.summary, v.summary
    said = [e for e in r.events if e.kind == "launcher"]
    assert {e.label for e in said} >= {"mp.spawn stops the other processes (SIGTERM)"}, said


def test_mp_spawn_passing_on_a_peers_error_is_only_a_consequence() -> None:
    """mp.spawn saw process 0 end first and passed on its error (a connection its failed peer closed): the cause
    is not in the console, and the answer says so rather than blame process 0."""
    v = triage([str(CORPUS / "spawn-peer.log")]).verdict
    assert v.status == "secondary-only" and v.confidence == "low", v.summary
    assert "local rank 0 on unknown node failed only as a consequence of a peer" in v.summary, v.summary


def test_a_dataloader_workers_exception_is_named_where_it_was_raised() -> None:
    """torch re-raises a DataLoader worker's exception in its rank ("KeyError: Caught KeyError in DataLoader worker
    process 1.") with the worker's "Original Traceback" under it: the worker's exception, and its frame in the job's
    code, are the failure (a real torchrun console: tests/data/logs/catalogue/loader_raise.py)."""
    v = triage([str(REPO / "tests" / "data" / "logs" / "catalogue" / "dataloader-raise.log")]).verdict
    assert v.primary is not None and v.primary.who.rank == 1, v.summary
    assert v.primary.message == "KeyError: \"sample 37: missing field 'labels'\" (in DataLoader worker process 1)"
    assert v.primary.detail["raised_in"] == "/tmp/real2/dlerr.py:12, in __getitem__", v.primary.detail


def test_torchrun_interrupted_by_ctrl_c_is_the_users_stop_not_a_failure(tmp_path: Path) -> None:
    """SIGINT to torchrun (Ctrl-C; tests/data/logs/catalogue/interrupt.py): its ranks' KeyboardInterrupt are that, not
    a failure of the job's own; a failure before the interrupt stays the answer."""
    console = (REPO / "tests" / "data" / "logs" / "catalogue" / "torchrun-ctrl-c.log").read_text()
    v = triage([_write(tmp_path, console)]).verdict
    assert v.status == "interrupted" and not v.failed and v.hint is None, v.summary
    assert v.summary.startswith("the job was stopped by the user (torchrun received SIGINT at 01:25:37: Ctrl-C), not by "
                                "a failure of its own"), v.summary
    failed = "[rank1]: Traceback (most recent call last):\n[rank1]:   File \"/job/train.py\", line 3, in <module>\n" \
             "[rank1]: ValueError: bad batch\n"
    v = triage([_write(tmp_path, failed + console, "failed.log")]).verdict
    assert v.status == "failure" and v.summary.startswith("first failure: rank 1")
    assert v.summary.endswith("; then torchrun was interrupted (SIGINT, Ctrl-C)"), v.summary


def test_kubectl_logs_prefix_names_each_lines_pod(tmp_path: Path) -> None:
    """`kubectl logs -l training.kubeflow.org/job-name=job --prefix --timestamps`: every line behind its pod's and
    container's label ("[pod/%s/%s] ", staging/src/k8s.io/kubectl/pkg/cmd/logs/logs.go), the pod a node; torch's
    own [rankN] after it."""
    worker = "[pod/job-worker-0/pytorch] 2025-03-02T03:14:0{s}.120000000Z "
    master = "[pod/job-master-0/pytorch] 2025-03-02T03:14:0{s}.500000000Z "
    text = (master.format(s=5) + "[rank0]: step 100\n" + worker.format(s=6) + "[rank1]: step 100\n"
            + worker.format(s=7) + "[rank1]: Traceback (most recent call last):\n"
            + worker.format(s=7) + "[rank1]:   File \"/workspace/train.py\", line 40, in <module>\n"
            + worker.format(s=7) + "[rank1]: ValueError: bad batch\n"
            + master.format(s=8) + "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] "
            "Connection closed by peer [10.4.2.7]:23456\n")
    r = triage([_write(tmp_path, text)])
    v = r.verdict
    assert v.primary is not None and (v.primary.who.rank, v.primary.who.node) == (1, "job-worker-0"), v.summary
    assert v.summary.startswith("first failure: rank 1 (job-worker-0) at 03:14:07: ValueError: bad batch"), v.summary
    assert r.nodes == ["job-master-0", "job-worker-0"], r.nodes
