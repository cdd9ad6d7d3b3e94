"""Tracebacks as users paste them: cut above their header, cut at both ends, inside rich's box, and a launcher's
failure summary cut before it says which worker failed. Each is a failure the job had: never "no failure found".

The texts are cut from real consoles in tests/data (written on this machine by the programs themselves).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ml_debug.logs.result import CUT_SHORT
from ml_debug.logs.triage import triage
from tests.conftest import REPO

DATA = REPO / "tests" / "data"
ACCELERATE = (DATA / "logs_corpus" / "accelerate.log").read_text().splitlines()  # rank 1's traceback: lines 3-8
RICH = (DATA / "logs" / "rich_traceback.log").read_text().splitlines()


def _write(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "console.log"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_paste_that_starts_at_a_frame_is_its_writers_traceback(tmp_path: Path) -> None:
    """The header is cut off: the frames still open the traceback, and its exception is rank 1's failure."""
    v = triage([_write(tmp_path, ACCELERATE[4:8])]).verdict  # from the code line of the first frame
    assert v.status == "failure" and v.primary is not None, v.summary
    assert (v.primary.who.rank, v.primary.kind) == (1, "traceback"), v.primary
    assert v.primary.message == "ValueError: bad batch on rank 1: shape mismatch", v.summary
    assert any('File "' in t for t in v.primary.text), v.primary.text


def test_frames_cut_at_both_ends_are_a_failure_whose_cause_is_not_in_the_logs(tmp_path: Path) -> None:
    v = triage([_write(tmp_path, ACCELERATE[3:7])]).verdict  # frames only: no header, no exception
    assert v.status == "failure" and v.primary is not None, v.summary
    assert (v.primary.who.rank, v.primary.message) == (1, CUT_SHORT), v.summary
    assert v.confidence == "medium" and "ends before its exception" in v.confidence_why, v.confidence_why


def test_a_paste_indented_as_a_whole_is_read_as_it_was_written(tmp_path: Path) -> None:
    """Every line two spaces in (a quote in an issue): the indentation comes off first (repair.py), and the frames
    open the traceback its paste cut above the header."""
    r = triage([_write(tmp_path, ["  " + ln.split(": ", 1)[1] for ln in ACCELERATE[3:8]])])
    v = r.verdict
    assert v.primary is not None and v.primary.message == "ValueError: bad batch on rank 1: shape mismatch", v.summary
    assert v.primary.kind == "traceback", v.primary
    assert r.sources[0].repairs == ["an indentation of 2 spaces on every line removed"], r.sources[0].repairs


def test_a_rich_traceback_is_read_whole_and_its_boxs_source_lines_are_no_failure(tmp_path: Path) -> None:
    """rich's box holds the source around each frame ("raise RuntimeError(f"CUDA error: ...")"): that line is
    code, not the failure; the exception after the box is."""
    r = triage([str(DATA / "logs" / "rich_traceback.log")])
    v = r.verdict
    assert v.primary is not None and v.primary.kind == "traceback", v.summary
    assert v.primary.message.startswith("RuntimeError: CUDA error: an illegal memory access"), v.summary
    assert v.primary.text[0].startswith("╭") and v.primary.text[-1].startswith("RuntimeError"), v.primary.text
    assert [e.kind for e in r.events] == ["traceback"], [(e.kind, e.message) for e in r.events]
    assert v.hint is not None and "CUDA_LAUNCH_BLOCKING=1" in v.hint, v.hint


def test_a_rich_traceback_cut_inside_its_box_is_a_failure(tmp_path: Path) -> None:
    v = triage([_write(tmp_path, RICH[:12])]).verdict
    assert v.status == "failure" and v.primary is not None and v.primary.message == CUT_SHORT, v.summary


def test_torchruns_summary_cut_before_its_exit_code_still_says_a_worker_failed(tmp_path: Path) -> None:
    """torchrun's traceback and summary, cut after its first entry's first field: which worker failed is not in
    the logs, but one did (a weak failure of the job: a rank's own line would outrank it)."""
    lines = (DATA / "logs_corpus" / "torchrun-every-rank.log").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Traceback"))
    cut = next(i for i, ln in enumerate(lines) if ln.startswith("Failures:")) + 3  # "[1]:" and its time
    text = lines[start:cut]
    assert not any("exitcode" in ln for ln in text) and "ChildFailedError" in "\n".join(text)
    v = triage([_write(tmp_path, text)]).verdict
    assert v.status == "failure" and v.primary is not None and v.primary.kind == "launcher", v.summary
    assert v.summary.startswith("first failure: the job: torchrun reports a failed worker"), v.summary
    assert v.confidence == "medium" and "only an exit code" in v.confidence_why, v.confidence_why


RESTART = (DATA / "logs" / "catalogue" / "restart-failed.log").read_text().splitlines()
SUMMARY = RESTART[next(i for i, ln in enumerate(RESTART) if ln.startswith("torch.distributed.elastic")):]


@pytest.mark.parametrize("header", ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "ChildFailedError:"])
def test_torchruns_summary_without_its_traceback_cut_at_the_root_cause_names_that_rank(tmp_path: Path, header: str) -> None:
    """The summary's header line alone, its traceback cut off above (or drawn in rich's box, which writes the bare
    name), and the summary cut after its root cause's rank: that rank, a weak failure. Rank 0's entry, told whole
    (SIGTERM), is a consequence."""
    box = ["│ ❱ 383 │   │   │   raise ChildFailedError(                                 │", "╰" + "─" * 60 + "╯"]
    cut = next(i for i, ln in enumerate(SUMMARY) if ln.strip().startswith("rank      : 1"))
    v = triage([_write(tmp_path, [*box, header, *SUMMARY[1:cut + 1]])]).verdict
    assert v.status == "failure" and v.primary is not None and not v.primary.strong, v.summary
    assert v.summary.startswith("first failure: rank 1, reported at 19:50:37: torchrun's failure summary (ChildFailedError) names it the root "
                                "cause, but is cut short before its exit code"), v.summary


def test_a_root_cause_cut_before_its_exit_code_ties_with_an_entry_of_its_second(tmp_path: Path) -> None:
    """Rank 1's entry says exit code 1 at 08:16:22; the Root Cause entry, rank 0 at the same second, is cut before
    its exit code: it is such an exit all the same, so the two tie, and torchrun's Root Cause picks rank 0."""
    lines = (DATA / "logs" / "accounting" / "same_error_both_ranks.log").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("torch.distributed.elastic"))
    cut = next(i for i, ln in enumerate(lines) if ln.strip().startswith("rank      : 0"))
    v = triage([_write(tmp_path, lines[start:cut + 1])]).verdict
    assert v.primary is not None and v.primary.who.rank == 0 and v.tie, v.summary
    assert v.summary.startswith("tie: rank 0, rank 1 failed in the same second"), v.summary
    assert "(torchrun's 'Root Cause' picks rank 0)" in v.summary, v.summary


def test_a_summary_entrys_signal_stands_for_its_missing_exit_code(tmp_path: Path) -> None:
    """An entry whose exitcode line is lost (a garbled paste) still says its signal: "traceback : Signal 15 (SIGTERM)
    received by PID 4363" is that pid's exit by SIGTERM."""
    lines = [ln for ln in SUMMARY if "exitcode" not in ln]
    report = triage([_write(tmp_path, lines)])
    (ev,) = [e for e in report.events if e.who.rank == 0]
    assert (ev.detail.get("exit_code"), ev.detail.get("pid")) == (-15, 4363), ev


def test_mpiruns_banner_cut_before_it_names_the_process_still_says_one_failed(tmp_path: Path) -> None:
    """Open MPI's "Primary job terminated normally, but 1 process returned a non-zero exit code" without the lines
    that name it: a weak failure of the job. With them, the process they name is the failure, and the banner is
    no second one."""
    lines = (DATA / "logs_corpus" / "mpirun.log").read_text().splitlines()
    banner = next(i for i, ln in enumerate(lines) if ln.startswith("Primary job"))
    v = triage([_write(tmp_path, ["step 10 loss 2.3", *lines[banner - 1:banner + 3]])]).verdict
    assert v.status == "failure" and v.primary is not None and not v.primary.strong, v.summary
    assert v.summary == ("first failure: the job: mpirun reports 1 process(es) returned a non-zero exit code (which "
                         "one: not in these lines)"), v.summary
    whole = triage([str(DATA / "logs_corpus" / "mpirun.log")])
    assert not [e for e in whole.events if "mpirun reports" in e.message], whole.events
    assert whole.verdict.summary.startswith("first failure: rank 2: ValueError: bad batch"), whole.verdict.summary


def test_torch_distributed_launchs_called_process_error_names_no_rank(tmp_path: Path) -> None:
    """torch.distributed.launch (torch 1.x, launch.py's main) waits for its children in order and raises
    ``subprocess.CalledProcessError(returncode=process.returncode, cmd=cmd)`` with the ``cmd`` of the *last* child it
    started: its ``--local_rank=7`` does not say which one failed. The signal is the fact; the rank stays unknown."""
    text = ['Traceback (most recent call last):',
            '  File "/opt/conda/lib/python3.8/site-packages/torch/distributed/launch.py", line 259, in main',
            '    cmd=cmd)',
            "subprocess.CalledProcessError: Command '['/opt/conda/bin/python3', '-u', 'train.py', '--local_rank=7', "
            "'--epochs', '90']' died with <Signals.SIGSEGV: 11>."]
    v = triage([_write(tmp_path, text)]).verdict
    assert v.primary is not None and v.summary == "first failure: unknown rank: crashed with SIGSEGV", v.summary
    assert "rank_by" not in v.primary.detail, v.primary.detail


def test_a_summary_copied_from_a_rendered_table_with_its_fields_run_together_names_its_rank(tmp_path: Path) -> None:
    """A summary pasted from a page that drew it as a table: the field names on lines of their own, their values
    after them, and the rank's and exit code's fields run together on one line. The rank and its exit code (a
    signal: SIGKILL) are still read."""
    lines = ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", "train.py FAILED", "Failures:",
             "<NO_OTHER_FAILURES>", "Root Cause (first observed failure) :", "[0]:", "time", "host",
             "2023-09-14 01:45:50", "node7", "rank2 (local rank: 2)exitcode: -9 (pid: 36071)error file: <N/A>",
             "traceback : Signal 9 (SIGKILL) received by PID 36071"]
    v = triage([_write(tmp_path, lines)]).verdict
    assert v.primary is not None and v.primary.who.rank == 2 and v.primary.detail.get("exit_code") == -9, v.summary
    assert v.summary.startswith("first failure: rank 2: killed by SIGKILL"), v.summary
