"""Paths of ml_debug/logs/ that real logs take but no other unit test reached (found by a coverage run of
tests/unit/logs): how `mldebug launch` ended (a failure, then Ctrl-C; Ctrl-C alone; a restart that recovered; a success
with a traceback in its logs),
srun's step outcomes (Out Of Memory, Killed), bash's "Killed" job line, a c10d watchdog line cut short, gloo's
monitored barrier naming a peer, torchrun's Root Cause owning two identical unlabelled tracebacks, a progress bar
longer than a block, and `mldebug logs --rank` (demux) on a last line without a newline, on coloured lines and
past a line longer than two blocks.

The launch directories and the torchrun console are real runs on this machine (tests/data/logs/README.md); the
Slurm, bash and c10d lines are the programs' own wording (each case names where it comes from).
"""

from __future__ import annotations

from pathlib import Path

from ml_debug.logs.catalogue import WATCHDOG_HINT
from ml_debug.logs.result import PRIMARY, SECONDARY
from ml_debug.logs.triage import demux, triage
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "logs"


def _write(tmp: Path, text: str, name: str = "job.log") -> str:
    path = tmp / name
    path.write_text(text)
    return str(path)


# ----------------------------------------------------------------------------- how `mldebug launch` ended


def test_a_failure_then_ctrl_c_is_still_the_failure() -> None:
    """`mldebug launch --max-restarts 1`: rank 1 raised in attempt 0, torchrun restarted the ranks, and the user
    pressed Ctrl-C during attempt 1 (exit code 130). The ranks' KeyboardInterrupt is the user's; rank 1's
    ValueError came first and stays the first failure, with the Ctrl-C said after it."""
    v = triage([str(DATA / "launch_fail_then_ctrl_c")]).verdict
    assert v.status == "failure" and v.primary is not None, v.summary
    assert (v.primary.who.rank, v.primary.message) == (1, "ValueError: bad batch on rank 1"), v.summary
    assert v.summary.startswith("first failure: rank 1 (vm)"), v.summary
    assert v.summary.endswith("; then the job was stopped by the user (Ctrl-C)"), v.summary
    assert v.failed


def test_a_job_that_succeeded_with_a_traceback_and_no_later_attempt_says_it_did_not_stop_it() -> None:
    """`mldebug launch` exited 0, one attempt: rank 1 printed a caught exception's traceback
    (traceback.print_exc()) and finished. No later attempt recovered from it: the job succeeded despite it."""
    report = triage([str(DATA / "launch_handled_traceback_exit_0")])
    v = report.verdict
    assert v.status == "recovered" and not v.failed and report.ok, v.summary
    assert v.summary.startswith("the job succeeded (mldebug launch exited with code 0): the failure in its logs "
                                "did not stop it; first failure: rank 1 (vm): OSError: checkpoint upload failed on "
                                "rank 1"), v.summary
    assert "recovered: the failure of attempt" not in v.summary
    assert v.hint is None


def test_a_restart_that_succeeded_recovered() -> None:
    """`mldebug launch --max-restarts 1`: rank 1 raised in attempt 0, attempt 1 finished (exit code 0)."""
    report = triage([str(DATA / "launch_restart_recovered")])
    v = report.verdict
    assert v.status == "recovered" and not v.failed and report.ok, v.summary
    assert v.summary.startswith("the job recovered: the failure of attempt 0 was followed by a successful attempt 1 "
                                "(mldebug launch exited with code 0); first failure: rank 1 (vm)"), v.summary
    assert v.primary is not None and v.primary.message == "ValueError: transient failure on rank 1"
    assert v.hint is None


def test_ctrl_c_with_no_failure_before_it_is_an_interruption() -> None:
    """Ctrl-C during attempt 0, nothing failed before it: the ranks' KeyboardInterrupt is the user's, not a failure."""
    report = triage([str(DATA / "launch_ctrl_c_only")])
    v = report.verdict
    assert v.status == "interrupted" and not v.failed and v.hint is None and v.basis is None, v.summary
    assert v.summary.startswith("the job was stopped by the user (Ctrl-C: mldebug launch exited with code 130), not "
                                "by a failure of its own; the ranks' lines: no primary failure found"), v.summary


def _launch_ended_by(tmp: Path, data: str, sig: str) -> Path:
    """A copy of a real launch directory whose launch.json says ``sig`` stopped mldebug launch."""
    import json
    import shutil

    shutil.copytree(DATA / data, tmp / data)
    manifest = tmp / data / "vm" / "launch.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "signal": sig}))
    return tmp / data


def test_a_launch_stopped_by_sigterm_was_stopped_from_outside_not_by_the_user(tmp_path: Path) -> None:
    """A scheduler's time limit, scancel or kill sends mldebug launch SIGTERM (launch.json's ``signal``): the job was
    stopped from outside, not by the user's Ctrl-C; the same directory that says SIGINT is the user's Ctrl-C."""
    v = triage([str(_launch_ended_by(tmp_path / "term", "launch_ctrl_c_only", "SIGTERM"))]).verdict
    assert v.status == "interrupted" and not v.failed, v.summary
    assert v.summary.startswith("the job was stopped from outside (SIGTERM: mldebug launch exited with code 130; kill, "
                                "timeout, a scheduler's time limit or scancel), not by a failure of its own"), v.summary
    v = triage([str(_launch_ended_by(tmp_path / "int", "launch_ctrl_c_only", "SIGINT"))]).verdict
    assert v.summary.startswith("the job was stopped by the user (Ctrl-C: mldebug launch exited with code 130)"), v.summary


def test_a_failure_then_sigterm_is_the_failure_with_no_ctrl_c_said_after_it(tmp_path: Path) -> None:
    v = triage([str(_launch_ended_by(tmp_path, "launch_fail_then_ctrl_c", "SIGTERM"))]).verdict
    assert v.status == "failure" and v.primary is not None and v.primary.who.rank == 1, v.summary
    assert "Ctrl-C" not in v.summary and "stopped by the user" not in v.summary, v.summary


# ----------------------------------------------------------------------------- Slurm and bash

# Slurm's srun (src/api/step_launch.c, _task_finish's messages): "Exited with exit code N", "Out Of Memory", or the
# signal's name (strsignal: "Killed", "Terminated") after "<node>: task(s) <ids>: "; slurmstepd's cgroup plugin
# (task_cgroup_memory.c): "Detected N oom_kill event in StepId=J.S. Some of the step tasks have been OOM Killed."
SRUN_OOM = "srun: error: node3: task 5: Out Of Memory\n"
SRUN_KILLED = ("srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
               "srun: error: node1: tasks 0-3: Killed\n"
               "srun: error: node3: task 4: Killed\n")
STEPD_OOM = ("slurmstepd: error: Detected 1 oom_kill event in StepId=1234.0. Some of the step tasks have been OOM "
             "Killed.\n")


def test_srun_out_of_memory_is_the_failure_and_the_tasks_it_killed_follow(tmp_path: Path) -> None:
    report = triage([_write(tmp_path, SRUN_OOM + SRUN_KILLED, "slurm-1234.out")])
    v = report.verdict
    assert v.status == "failure" and v.primary is not None, v.summary
    assert (v.primary.who.rank, v.primary.who.node, v.primary.kind, v.primary.cls) == (5, "node3", "oom", PRIMARY)
    assert v.primary.message == "out of memory (Slurm)"
    killed = sorted((e for e in report.events if e.kind == "signal"), key=lambda e: e.who.rank or 0)
    assert [(e.who.rank, e.who.node) for e in killed] == [(0, "node1"), (1, "node1"), (2, "node1"), (3, "node1"),
                                                          (4, "node3")]
    assert all(e.cls == SECONDARY and not e.strong and e.message == "killed by srun after another task failed"
               for e in killed), killed
    assert 'ranks 0-4 failed after it: 5 x "killed by srun"' in v.summary, v.summary
    assert not v.independent
    assert v.hint is not None and v.hint.startswith("rank 5 (node3) ran out of the host's memory (RAM, not the GPU's)"), v.hint
    assert report.launchers == ["srun"]


def test_slurmstepds_oom_kill_line_before_sruns_names_the_task_that_ran_out(tmp_path: Path) -> None:
    """The order Slurm prints them: slurmstepd's oom_kill event, then srun's "task 5: Out Of Memory". Both say the
    one OOM; srun's says whose."""
    v = triage([_write(tmp_path, STEPD_OOM + SRUN_OOM + SRUN_KILLED, "slurm-1234.out")]).verdict
    assert v.primary is not None and (v.primary.who.rank, v.primary.who.node) == (5, "node3"), v.summary
    assert not v.independent, v.summary


def test_srun_killing_tasks_with_nothing_else_is_only_a_consequence(tmp_path: Path) -> None:
    v = triage([_write(tmp_path, SRUN_KILLED, "slurm-1234.out")]).verdict
    assert v.status == "secondary-only" and v.primary is None, v.summary
    assert v.secondary == [{"label": "killed by srun", "count": 5, "ranks": "0-4"}]


def test_bashs_killed_job_line_is_a_kill_without_a_message(tmp_path: Path) -> None:
    """bash's report of a child killed by SIGKILL (the OOM killer, most often): "<script>: line N: PID Killed
    <command>" (jobs.c's "Killed" status, in a batch script's output)."""
    log = _write(tmp_path, "step 10 loss 2.31\n/var/spool/slurmd/job1234/slurm_script: line 12:  4242 Killed"
                           "                  python train.py\n", "slurm-1234.out")
    report = triage([log])
    v = report.verdict
    assert v.status == "failure" and v.primary is not None, v.summary
    assert (v.primary.kind, v.primary.cls, v.primary.strong) == ("signal", PRIMARY, False)
    assert v.primary.message == "Killed (SIGKILL)" and v.primary.line == 2
    assert v.confidence == "medium" and "only an exit code or a kill says it" in v.confidence_why


# ----------------------------------------------------------------------------- c10d and gloo

# c10d's watchdog line (ProcessGroupNCCL.cpp, torch 2.4+), as tests/data/logs/watchdog_one_rank_silent.log holds it
WATCHDOG = ("[rank1]:[E0517 04:12:31.203318732 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, "
            "Timeout(ms)=600000) ran for 600044 milliseconds before timing out.")
CUT = WATCHDOG[:WATCHDOG.index("NumelIn=") + len("NumelIn=98015")]  # cut short (a log collector's line limit)


def test_a_watchdog_line_cut_short_is_still_that_ranks_watchdog_timeout(tmp_path: Path) -> None:
    """The line holds the watchdog's words but not its full pattern (no "ran for N milliseconds"): read as a
    failure line of the watchdog's class, of the rank its "[Rank 1]" names."""
    report = triage([_write(tmp_path, CUT + "\n")])
    ev = [e for e in report.events if e.cls == SECONDARY]
    assert len(ev) == 1, report.events
    assert (ev[0].who.rank, ev[0].label, ev[0].strong) == (1, "NCCL watchdog timeout", True)
    assert ev[0].message.startswith("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808")
    v = report.verdict
    assert v.status == "secondary-only" and v.primary is None, v.summary
    assert v.secondary == [{"label": "NCCL watchdog timeout", "count": 1, "ranks": "1"}]


def test_a_watchdog_line_cut_short_gives_the_watchdogs_next_step(tmp_path: Path) -> None:
    full = triage([_write(tmp_path, WATCHDOG + "\n", "full.log")]).verdict
    assert full.hint is not None and WATCHDOG_HINT in full.hint  # the whole line gives it
    cut = triage([_write(tmp_path, CUT + "\n", "cut.log")]).verdict
    assert cut.hint is not None and WATCHDOG_HINT in cut.hint, cut.hint


def test_gloos_monitored_barrier_names_the_peer_that_did_not_arrive() -> None:
    """A real `torchrun --nproc-per-node 2` of gloo.py: rank 0's monitored_barrier names rank 1, which torchrun then
    stopped. No rank failed on its own; the peers name rank 1."""
    v = triage([str(DATA / "catalogue" / "gloo_barrier.log")]).verdict
    assert v.status == "secondary-only" and v.primary is None, v.summary
    assert v.blamed_ranks == "1"
    assert v.summary.endswith("; peers name rank(s) 1"), v.summary


# ----------------------------------------------------------------------------- torchrun's accounting


def test_torchruns_root_cause_owns_identical_unlabelled_tracebacks() -> None:
    """A real `torchrun --nproc-per-node 2` where both ranks raise the same error and no line has a label: torchrun
    says both failed; its Root Cause (rank 0) owns the traceback."""
    v = triage([str(DATA / "accounting" / "same_error_both_ranks.log")]).verdict
    assert v.status == "failure" and v.primary is not None, v.summary
    assert v.primary.who.rank == 0, v.summary
    assert v.primary.message == "ValueError: missing key 'lr' in config.yaml (world size 2)"
    assert v.primary.detail.get("rank_by") == "torchrun's failure summary (its root cause)", v.primary.detail


# ----------------------------------------------------------------------------- long lines


def _tqdm(desc: str, size: int) -> str:
    """A tqdm bar redrawn with ``\\r`` and no newline, ``size`` characters or more (tqdm's default format)."""
    frames = "".join(f"\r{desc}: {i:3d}%|{'#' * (i // 10):<10}| {i}/100 [00:{i // 10:02d}<00:{10 - i // 10:02d},  "
                     f"9.90it/s]" for i in range(101))
    return frames * (size // len(frames) + 1)


TRACEBACK = ('0: Traceback (most recent call last):\n0:   File "/job/train.py", line 9, in <module>\n'
             "0:     main()\n0: ValueError: bad batch on rank 0\n")


def _bar_then_traceback(tmp: Path) -> tuple[str, str]:
    """srun --label: rank 0's tqdm bar, 3 MiB without a newline (line 3), then its traceback (lines 4-7)."""
    text = "0: step 1\n1: step 1\n0: " + _tqdm("train", 3 << 20) + "\n" + TRACEBACK + "1: step 2\n"
    return _write(tmp, text), text


def test_a_progress_bar_longer_than_a_block_does_not_hide_the_traceback_after_it(tmp_path: Path) -> None:
    log, _ = _bar_then_traceback(tmp_path)
    v = triage([log]).verdict
    assert v.primary is not None and v.primary.who.rank == 0, v.summary
    assert v.primary.message == "ValueError: bad batch on rank 0", v.summary
    assert v.primary.text[-1] == "ValueError: bad batch on rank 0", v.primary.text


def test_the_line_of_a_failure_after_a_very_long_line_is_the_files(tmp_path: Path) -> None:
    log, text = _bar_then_traceback(tmp_path)
    v = triage([log]).verdict
    assert v.primary is not None and v.primary.line == 4, v.primary.line
    assert v.primary.offset == text.index("0: Traceback"), v.primary.offset


# ----------------------------------------------------------------------------- mldebug logs --rank (demux)


def _demux(path: str, rank: int) -> tuple[list[tuple[int, str]], dict[str, object]]:
    got: list[tuple[int, str]] = []
    out = demux([path], rank=rank, node=None, emit=lambda src, n, text: got.append((n, text)))
    return got, out


def test_demux_keeps_a_last_line_without_a_newline(tmp_path: Path) -> None:
    """A console cut while the job ran (a copy taken mid-write, a killed tee): its last line has no newline."""
    log = _write(tmp_path, "0: step 1\n1: step 1\n" + TRACEBACK.rstrip("\n"))
    got, out = _demux(log, 0)
    assert got == [(1, "step 1"), (3, "Traceback (most recent call last):"),
                   (4, '  File "/job/train.py", line 9, in <module>'), (5, "    main()"),
                   (6, "ValueError: bad batch on rank 0")]
    assert out["lines"] == 5 and out["truncated"] is False and out["ranks_seen"] == "0-1"
    assert _demux(log, 1)[0] == [(2, "step 1")]


def test_demux_reads_the_labels_of_coloured_lines(tmp_path: Path) -> None:
    """Python 3.13's coloured traceback under srun --label: the text comes back without its colour codes."""
    log = _write(tmp_path, "0: \x1b[1;35mValueError\x1b[0m: \x1b[35mbad batch on rank 0\x1b[0m\n"
                           "1: \x1b[32mstep 1\x1b[0m\n")
    assert _demux(log, 0)[0] == [(1, "ValueError: bad batch on rank 0")]
    assert _demux(log, 1)[0] == [(2, "step 1")]


def test_demux_numbers_lines_after_a_very_long_line_as_the_file_does(tmp_path: Path) -> None:
    log, _ = _bar_then_traceback(tmp_path)
    got, _ = _demux(log, 0)
    assert [n for n, _ in got] == [1, 3, 4, 5, 6, 7], [n for n, _ in got]
    bar = got[1][1]  # shown cut at MAX_LINE, and said to be
    assert bar.startswith("\rtrain:") and bar.endswith("…") and len(bar.encode()) < (3 << 20), bar[:40]
    assert _demux(log, 1)[0] == [(2, "step 1"), (8, "step 2")]
