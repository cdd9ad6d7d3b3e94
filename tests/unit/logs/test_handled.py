"""A traceback printed by a logging call below ERROR (`logger.warning(..., exc_info=True)`) was handled when the
program went on: a warning, never the first failure. A C++ warning of c10d's that merely comes before a rank's own
traceback does not make it handled (found on the rig: `[W1128 04:18:40.186 socket.cpp:207] [c10d] The hostname ...`
then rank 2's ValueError), nor does a launcher's own line (DeepSpeed's `[INFO] [launch.py:102:main] Setting
CUDA_VISIBLE_DEVICES=0,1`), nor an INFO line when the traceback is the last thing in the file: a crash right after a
log line, as consoles users posted show it (the verdict is then less sure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ml_debug.logs.triage import triage
from tests.conftest import REPO

TRACEBACK = """Traceback (most recent call last):
  File "/job/train.py", line 47, in <module>
    main()
  File "/job/train.py", line 39, in main
    raise ValueError("bad batch on rank 2")
ValueError: bad batch on rank 2
"""


@pytest.mark.parametrize(("before", "handled"), [
    ("2026-11-28 04:18:40,186 WARNING retrying the batch\n", True),
    ("WARNING:root:retrying the batch\n", True),
    ("W1128 04:18:40.186430 140212 train.py:88] retrying the batch\n", True),  # absl's glog-style record
    ("[W1128 04:18:40.186430027 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. "
     "err=-3\n", False),
    ("step 12 loss 2.31\n", False),
])
def test_a_traceback_after_a_logging_record_below_error_is_handled(tmp_path: Path, before: str, handled: bool) -> None:
    log = tmp_path / "rank2.log"
    log.write_text("starting\n" + before + TRACEBACK + "step 13 loss 2.30\n")  # the program went on
    v = triage([str(log)]).verdict
    if handled:
        assert v.status != "failure" or v.primary is None or "ValueError" not in v.primary.message, v.summary
    else:
        assert v.status == "failure" and v.primary is not None and "ValueError: bad batch" in v.primary.message, \
            v.summary
    log.write_text("starting\n" + before + TRACEBACK)  # the last thing in the file: it ended the program
    v = triage([str(log)]).verdict
    assert v.status == "failure" and v.primary is not None and "ValueError: bad batch" in v.primary.message, v.summary
    assert ("may have been caught" in v.confidence_why) == handled, v.confidence_why


def test_a_launchers_own_line_before_a_traceback_does_not_make_it_handled(tmp_path: Path) -> None:
    """DeepSpeed's launcher logs at INFO, then a rank's uncaught traceback follows (its lines are unlabelled); the
    next rank's copy follows at once."""
    log = tmp_path / "ds.log"
    log.write_text("[2020-12-24 16:25:13,902] [INFO] [launch.py:102:main] Setting CUDA_VISIBLE_DEVICES=0,1\n"
                   + TRACEBACK + TRACEBACK + "[2020-12-24 16:25:15,001] [INFO] [launch.py:131:main] done\n")
    v = triage([str(log)]).verdict
    assert v.status == "failure" and v.primary is not None and "ValueError: bad batch" in v.primary.message, v.summary
    assert "may have been caught" not in v.confidence_why, v.confidence_why


def test_a_raised_copy_of_a_handled_exception_is_the_failure(tmp_path: Path) -> None:
    """Retried and logged twice, then raised: the same exception of the same writer, handled and not, are two."""
    log = tmp_path / "rank0.log"
    retry = "2026-11-28 04:18:4{i},186 WARNING retrying the batch\n" + TRACEBACK
    log.write_text(retry.format(i=0) + retry.format(i=1) + "2026-11-28 04:18:42,186 step 13 loss 2.30\n" + TRACEBACK
                   + "2026-11-28 04:18:43,000 INFO shutting down\n")
    v = triage([str(log)]).verdict
    assert v.status == "failure" and v.primary is not None and v.primary.line == 16, v.summary


HANDLED = """2026-11-28 04:{m:02d}:{s:02d},000 [WARNING] data: fetching shard {i:05d} failed, retrying (1/5)
Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/urllib3/connection.py", line 466, in getresponse
    httplib_response = super().getresponse()
  File "/usr/lib/python3.11/socket.py", line 706, in readinto
    return self._sock.recv_into(b)
TimeoutError: The read operation timed out

2026-11-28 04:{m:02d}:{s:02d},500 [INFO] trainer: step {i} | loss 2.1
"""


@pytest.mark.parametrize("retries", [3, 200])
def test_the_fatal_traceback_after_many_handled_ones_is_the_failure(tmp_path: Path, retries: int) -> None:
    """A data loader that retried hundreds of times, each retry logged with its traceback, then died: the handled
    tracebacks (read once, their repeats counted) never crowd out the one that ended the rank."""
    log = tmp_path / "rank0.log"
    log.write_text("".join(HANDLED.format(m=i // 60 % 60, s=i % 60, i=i) for i in range(retries))
                   + "2026-11-28 05:00:00,000 [ERROR] trainer: step failed\n" + TRACEBACK)
    report = triage([str(log)])
    v = report.verdict
    assert v.status == "failure" and v.primary is not None and "ValueError: bad batch" in v.primary.message, v.summary
    assert v.primary.line == retries * 9 + 2, v.primary.line


def test_records_of_one_shape_are_judged_alike_and_another_level_is_not(tmp_path: Path) -> None:
    """The level of a record before a traceback is kept per shape of the line (its digits aside:
    blocks.logged_level): records that differ in their numbers only are handled alike, one at ERROR of the same
    words is a record of another shape, and its traceback is the failure. Labelled lines are judged each."""
    log = tmp_path / "rank0.log"
    records = "".join(HANDLED.format(m=i, s=i * 7 % 60, i=i * 1234) for i in range(1, 6))
    log.write_text(records + HANDLED.format(m=9, s=9, i=9).replace("[WARNING]", "[ERROR]", 1).split("\n\n")[0]
                   .replace("TimeoutError: The read operation timed out", "ValueError: bad batch on rank 2") + "\n")
    report = triage([str(log)])
    handled = [e for e in report.events if e.detail.get("handled")]  # one per writer and exception (dedupe)
    assert [e.message for e in handled] == ["TimeoutError: The read operation timed out"], report.events
    v = report.verdict  # none of the five taken for a failure: the first is the ERROR record's
    assert v.primary is not None and "ValueError: bad batch" in v.primary.message and v.primary.line == 5 * 9 + 2, \
        v.summary
    labelled = tmp_path / "console.log"  # a labelled writer's record: its label is its own, the same writer's
    tb = TRACEBACK.replace(" on rank 2", "")
    labelled.write_text("".join(f"[rank{r}]:{line}\n" for r, record in ((1, "[WARNING]"), (3, "[ERROR]"))
                                for line in [f"2026-11-28 04:00:0{r},000 {record} retrying", *tb.splitlines()])
                        + "[rank1]:2026-11-28 04:00:04,000 [INFO] step 13\n")
    v = triage([str(labelled)]).verdict
    assert v.primary is not None and v.primary.who.rank == 3 and v.primary.line == 9, v.summary


@pytest.mark.parametrize(("line", "failed"), [
    # a logger below ERROR naming an exception in passing: the program caught it (a retry)
    ("2026-11-28 10:00:00,000 [WARNING] loader: got OSError: [Errno 5] Input/output error on shard 3, retrying", False),
    ("W1128 10:00:00.000000 123 torch/distributed/elastic/agent.py:12] got RuntimeError: boom", False),
    # at ERROR it may not have been: weak evidence, named only when nothing stronger is there, and said so
    ("2026-11-28 10:00:00,000 [ERROR] loader: got OSError: [Errno 5] Input/output error on shard 3", True),
])
def test_an_exception_a_log_line_names_in_passing(tmp_path: Path, line: str, failed: bool) -> None:
    path = tmp_path / "console.log"
    path.write_text(f"{line}\nstep 1 loss 2.3\ntraining done\n")
    v = triage([str(path)]).verdict
    if failed:
        assert v.status == "failure" and "only a log line names it" in v.confidence_why, (v.summary, v.confidence_why)
    else:
        assert v.summary == "no failure found (1 warning(s))", v.summary


def test_an_exception_python_ignored_is_no_failure(tmp_path: Path) -> None:
    """Python's "Exception ignored in: <function Loader.__del__ ...>" before a traceback: raised in a destructor (here at
    exit, as DataLoader iterators do) and ignored; the job exited 0 (tests/data/logs/catalogue/ignored.py made it). A
    failure after it is still the first failure."""
    ignored = REPO / "tests" / "data" / "logs" / "catalogue" / "exception-ignored.log"
    v = triage([str(ignored)]).verdict
    assert v.summary == "no failure found (1 warning(s))", v.summary
    path = tmp_path / "console.log"
    path.write_text(ignored.read_text() + TRACEBACK)
    v = triage([str(path)]).verdict
    assert v.status == "failure" and v.primary is not None and v.primary.message == "ValueError: bad batch on rank 2"
    # CPython's other wordings of the same hook (Python/errors.c: "Exception ignored %s", its err_msg)
    path.write_text("Exception ignored on calling ctypes callback function: <function cb at 0x7f>\n" + TRACEBACK
                    + "step 2\n")
    assert triage([str(path)]).verdict.summary == "no failure found (1 warning(s))"
