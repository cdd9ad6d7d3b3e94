"""More paths of ml_debug/logs/ that real logs take but no other unit test reached (a second coverage run of
tests/unit/logs, after test_untested_paths.py): a pasted-looking log too large to mend, `mldebug train
--metrics-dir` files gzipped or cut mid-write, tracebacks under kubectl logs --timestamps, two unlabelled writers
in one file (their tracebacks mixed, or one's line between the other's frames), torchrun's accounting when it
cannot tell whose traceback is whose, torchrun's failure summary cut inside an entry, kubectl's stamp before a torch
2.1 agent line, Ray 1.x's prefix without an actor name, and the sources' edges (an error file of its own, a file
named twice, a glob that matches nothing, a FIFO).

The lines are the programs' own: the torchrun console of tests/data/logs/accounting/same_error_both_ranks.log (a real
run), `mldebug train`'s own writer (ml_debug.train.metrics) for its metrics files and its human line, torchrun's
agent lines as test_launchers.AGENT_LINES holds them; each case names where the rest comes from.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path

import pytest

from ml_debug.core.errors import UsageError
from ml_debug.logs.repair import MEND_LIMIT
from ml_debug.logs.scan import BLOCK
from ml_debug.logs.triage import triage
from ml_debug.train.metrics import MetricsLog, StepMetrics, human_line
from tests.unit.logs.test_launchers import AGENT_LINES
from tests.unit.logs.test_untested_paths import DATA, _write

# the real console of `torchrun --nproc-per-node 2 same.py` where both ranks raised the same error, no line labelled
SAME = (DATA / "accounting" / "same_error_both_ranks.log").read_text().split("\n")
HEAD, TB_A, TB_B, TAIL = SAME[:4], SAME[4:8], SAME[8:12], SAME[12:]
VALUE_ERROR = "ValueError: missing key 'lr' in config.yaml (world size 2)"


# ----------------------------------------------------------------------------- a pasted log too large to mend


def test_a_numbered_log_over_the_mend_limit_is_read_as_it_is(tmp_path: Path) -> None:
    """`cat -n job.log > job.txt` of a console over repair.MEND_LIMIT (cat's "%6d\\t" numbers look like a viewer's):
    it is not mended in memory but read as it is, and its source says so; the failure line at its end is still
    found, at the file's own line number."""
    step = "[mldebug train] step 1/6 | loss 6.0563 | grad 0.787 | lr 6.00e-04 | 398 tok/s | mfu n/a"
    n = (MEND_LIMIT + 2 * BLOCK) // (len(step) + 8) + 1  # more than the mend limit and a block
    body = [step] * n + TB_A
    path = tmp_path / "job.txt"
    with path.open("w") as f:
        for i, line in enumerate(body, 1):
            f.write(f"{i:6d}\t{line}\n")
    assert path.stat().st_size > MEND_LIMIT + BLOCK
    report = triage([str(path)], jobs=1)
    assert report.sources[0].repairs == [f"looks pasted (damaged) but is over {MEND_LIMIT >> 20} MiB: read as it is"]
    v = report.verdict
    assert v.primary is not None and v.primary.message == VALUE_ERROR, v.summary
    assert v.primary.line == n + 4, v.primary.line


# ----------------------------------------------------------------------------- mldebug train --metrics-dir


def _metrics(metrics_dir: Path, rank: int, steps: int, event: str | None = None) -> Path:
    """rank-R.jsonl as `mldebug train --metrics-dir` writes it (its own writer): ``steps`` steps, then ``event``."""
    log = MetricsLog(metrics_dir, rank, log_every=1, steps=steps, stream=io.StringIO())
    for s in range(1, steps + 1):
        log.step(StepMetrics(step=s, rank=rank, loss=2.31, local_loss=2.3, grad_norm=0.79, lr=6e-4, tokens=256,
                             step_time_s=0.6, data_time_s=0.001, tokens_per_s=398.0, tflops=0.0003, hw_tflops=0.0003,
                             mfu=None, memory={"max_rss_bytes": 333 << 20}, time=1740881600.0 + s))
    if event is not None:
        log.event(event)
    log.close()
    return metrics_dir / f"rank-{rank}.jsonl"


def test_a_gzipped_metrics_file_gives_its_ranks_progress(tmp_path: Path) -> None:
    """rank-0.jsonl.gz (a metrics directory compressed after the job, `gzip -r`): read whole, its last step record
    is rank 0's progress; its last record (an event, no step) does not hide it."""
    plain = _metrics(tmp_path, 0, 7, event="kill-switch")
    with plain.open("rb") as f, gzip.open(tmp_path / "rank-0.jsonl.gz", "wb") as gz:
        gz.write(f.read())
    plain.unlink()
    _metrics(tmp_path, 1, 9)
    report = triage([str(tmp_path)], jobs=1)
    train = report.progress["train"]
    assert train["steps"] == {"0": 7, "1": 9}, train
    assert (train["max_step"], train["behind"]) == (9, "0"), train
    gz_info = next(s for s in report.sources if s.path.endswith("rank-0.jsonl.gz"))
    assert gz_info.bytes == len(gzip.decompress((tmp_path / "rank-0.jsonl.gz").read_bytes()))


def test_a_metrics_file_cut_mid_write_gives_the_last_whole_record(tmp_path: Path) -> None:
    """A job killed while rank 1 wrote its step 6 record: the file ends inside that JSON object. The progress is
    read from the last whole record (step 5)."""
    _metrics(tmp_path, 0, 6)
    path = _metrics(tmp_path, 1, 6)
    data = path.read_bytes()
    last = data.rstrip(b"\n").rsplit(b"\n", 1)[1]
    assert json.loads(last)["step"] == 6
    path.write_bytes(data[:len(data) - len(last) // 2 - 1])  # half of the last line, no newline
    report = triage([str(tmp_path)], jobs=1)
    train = report.progress["train"]
    assert train["steps"] == {"0": 6, "1": 5}, train
    assert train["behind"] == "1" and train["last_time"] == 1740881606.0, train


# ----------------------------------------------------------------------------- kubectl logs --timestamps

# `kubectl logs --timestamps trainjob-worker-0 > trainjob-worker-0.log` of a pod running torchrun (torch 1.13, no
# --tee): each line starts with the kubelet's RFC 3339 stamp; the worker's traceback is unlabelled. torch's CUDA
# error message and its two lines of advice (c10/cuda/CUDAException.cpp) come out at once, in the traceback's second;
# the agent's line of the worker's exit (AGENT_LINES["torch-1.10"]'s shape) a second later.
CUDA_TB = [
    "Traceback (most recent call last):",
    '  File "/job/train.py", line 41, in <module>',
    "    loss.backward()",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
]
AGENT_EXIT = ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 1 (pid: 4243) "
              "of binary: /usr/bin/python3")


def _kubectl(tmp: Path, later: str) -> str:
    lines = ["2024-05-01T03:14:05.100000000Z step 9 loss 2.3100"]
    lines += [f"2024-05-01T03:14:07.123456789Z {ln}" for ln in CUDA_TB]
    lines.append(later)
    return _write(tmp, "".join(ln + "\n" for ln in lines), "trainjob-worker-0.log")


def test_under_kubectl_stamps_a_line_of_a_later_second_ends_the_traceback(tmp_path: Path) -> None:
    """The agent's line, stamped a second after the traceback, is not the exception's message going on: it ends
    the traceback and is read as the agent's own line (local rank 1's exit)."""
    report = triage([_kubectl(tmp_path, "2024-05-01T03:14:08.512000000Z " + AGENT_EXIT)])
    tb = [e for e in report.events if e.kind == "traceback"]
    assert len(tb) == 1, report.events
    assert tb[0].text == CUDA_TB, tb[0].text  # its message's own lines (the same second), and no more
    assert tb[0].message == "RuntimeError: CUDA error: an illegal memory access was encountered"
    exits = [e for e in report.events if e.kind == "exit"]
    assert [(e.who.local_rank, e.detail["exit_code"], e.line) for e in exits] == [(1, 1, 8)], exits
    v = report.verdict
    assert v.primary is not None and v.primary.kind == "traceback" and v.primary.line == 2, v.summary
    assert (v.primary.who.local_rank, v.primary.who.node) == (1, "trainjob-worker-0"), v.primary.who
    assert v.primary.time_source == "line" and v.primary.time is not None and int(v.primary.time) % 60 == 7


def test_under_kubectl_stamps_a_line_of_the_same_second_is_the_message_going_on(tmp_path: Path) -> None:
    """The same line stamped in the traceback's own second: it is read as the exception's message going on
    (Python writes a traceback at once), as it would be without stamps."""
    report = triage([_kubectl(tmp_path, "2024-05-01T03:14:07.123456789Z NCCL_DEBUG=INFO may say more")])
    tb = [e for e in report.events if e.kind == "traceback"]
    assert len(tb) == 1 and tb[0].text == [*CUDA_TB, "NCCL_DEBUG=INFO may say more"], tb


# ----------------------------------------------------------------------------- two unlabelled writers in one file


def _mixed(order: str) -> list[str]:
    """The two ranks' tracebacks of the real console, their lines mixed as two writers of one file mix them
    (``order``: whose line comes next, ``a`` or ``b``), torchrun's lines around them as they were."""
    a, b, out = iter(TB_A), iter(TB_B), []
    for who in order:
        out.append(next(a if who == "a" else b))
    return HEAD + out + list(a) + list(b) + TAIL


def test_two_unlabelled_tracebacks_mixed_line_by_line_are_still_the_error_torchrun_reports(tmp_path: Path) -> None:
    """Both ranks raised the same ValueError at once and their stderr lines interleaved (ab ab ...): the job's
    first failure is that ValueError, of rank 0 (torchrun's Root Cause), as when the tracebacks come one after
    the other (test_untested_paths.test_torchruns_root_cause_owns_identical_unlabelled_tracebacks)."""
    report = triage([_write(tmp_path, "\n".join(_mixed("abababab")))])
    v = report.verdict
    assert v.primary is not None and v.primary.message == VALUE_ERROR, v.summary
    assert v.primary.who.rank == 0, v.summary
    assert not any(e.message == "traceback (cut short)" for e in report.events), report.events


def test_another_writers_line_between_the_frames_is_not_the_exception(tmp_path: Path) -> None:
    """Rank 0's progress line (`mldebug train`'s human line, no colon in it) lands between the frames of rank 1's
    traceback in one unlabelled file: it is skipped, and the exception is the traceback's own."""
    progress = "[mldebug train] " + human_line(
        StepMetrics(step=3, rank=0, loss=2.31, local_loss=2.3, grad_norm=0.79, lr=6e-4, tokens=256,
                    step_time_s=0.6, data_time_s=0.001, tokens_per_s=398.0, tflops=0.0003, hw_tflops=0.0003,
                    mfu=None, memory={"max_rss_bytes": 333 << 20}), 6)
    assert ":" not in progress
    lines = HEAD + TB_A[:2] + [progress] + TB_A[2:] + TAIL
    report = triage([_write(tmp_path, "\n".join(lines))])
    v = report.verdict
    assert v.primary is not None and v.primary.message == VALUE_ERROR, v.summary
    assert v.primary.line == 5 and v.primary.text == TB_A, v.primary.text
    assert v.primary.who.rank == 0, v.summary  # torchrun's accounting: the one traceback is its root cause's


# ----------------------------------------------------------------------------- torchrun's accounting


def test_two_different_unlabelled_tracebacks_stay_of_an_unknown_rank(tmp_path: Path) -> None:
    """The real console with rank 1's error another one (a KeyError): torchrun says both ranks failed, and its
    Root Cause cannot say which traceback is whose. No rank is guessed; the first traceback is the first
    failure."""
    other = [TB_B[0], TB_B[1], "    raise KeyError('lr')", "KeyError: 'lr'"]
    report = triage([_write(tmp_path, "\n".join(HEAD + TB_A + other + TAIL))])
    tbs = [e for e in report.events if e.kind == "traceback"]
    assert [(e.message, e.who.rank, e.who.local_rank) for e in tbs] == [(VALUE_ERROR, None, None),
                                                                        ("KeyError: 'lr'", None, None)], tbs
    assert not any("rank_by" in e.detail for e in tbs), [e.detail for e in tbs]
    v = report.verdict
    assert v.primary is not None and v.primary.message == VALUE_ERROR and v.primary.line == 5, v.summary
    assert v.summary.startswith("first failure: unknown rank"), v.summary


def test_a_failure_summary_cut_inside_an_entry_adds_no_exit_for_it(tmp_path: Path) -> None:
    """The real console cut inside torchrun's failure summary (a copy taken while it was written), after rank 1's
    rank line and before its exit code: rank 1 is seen, but no exit is made up for it; the agent's own line says
    rank 0 failed, and owns the traceback."""
    text = "\n".join(SAME)
    cut = text[:text.index("  exitcode  : 1 (pid: 21893)")]
    report = triage([_write(tmp_path, cut)])
    exits = [e for e in report.events if e.kind == "exit"]
    assert [(e.who.rank, e.detail["exit_code"]) for e in exits] == [(0, 1)], exits
    assert report.ranks_seen == "0-1"
    v = report.verdict
    assert v.primary is not None and v.primary.who.rank == 0 and v.primary.message == VALUE_ERROR, v.summary


# ----------------------------------------------------------------------------- labels


def test_kubectl_stamp_before_a_torch_2_1_agent_line(tmp_path: Path) -> None:
    """kubectl logs --timestamps of a pod running torchrun 2.1-2.3, whose agent lines start with their own
    bracketed time ("[2024-05-01 03:14:07,123] torch.distributed..."): the bracket after kubectl's stamp is no
    label; the line is the agent's report of local rank 3's exit."""
    line = "2024-05-01T03:14:07.200000000Z " + AGENT_LINES["torch-2.1"]
    report = triage([_write(tmp_path, "2024-05-01T03:14:05.000000000Z step 9 loss 2.3100\n" + line + "\n",
                            "trainjob-worker-0.log")])
    v = report.verdict
    assert v.primary is not None and v.primary.kind == "exit", v.summary
    assert (v.primary.who.rank, v.primary.who.local_rank, v.primary.who.node) == (None, 3, "trainjob-worker-0")
    assert v.primary.detail["exit_code"] == 1 and v.primary.detail.get("pid") == 4242, v.primary.detail
    assert v.primary.line == 2 and report.launchers == ["torchrun"]
    assert v.primary.time == pytest.approx(1714533247.2, abs=1e-3), v.primary.time  # kubectl's stamp: it says its zone (UTC)


def test_rays_prefix_without_an_actor_name_names_the_node(tmp_path: Path) -> None:
    """Ray's print_worker_logs (python/ray/_private/worker.py): "({prefix_for}{pid}, ip={ip}) " where prefix_for is
    "pid=" after the actor's or task's name, or "pid=" alone when the worker has neither (Ray 1.x's tasks)."""
    prefix = "(pid=81234, ip=10.0.0.12) "
    lines = ["step 10 loss 2.31", "Traceback (most recent call last):", '  File "/job/train.py", line 12, in <module>',
             "    raise ValueError('bad batch')", "ValueError: bad batch"]
    report = triage([_write(tmp_path, "".join(prefix + ln + "\n" for ln in lines), "ray.log")])
    v = report.verdict
    assert v.primary is not None and v.primary.kind == "traceback", v.summary
    assert v.primary.who.node == "10.0.0.12" and v.primary.message == "ValueError: bad batch", v.summary


# ----------------------------------------------------------------------------- sources


def test_an_error_file_of_its_own_name_is_read_as_one(tmp_path: Path) -> None:
    """TORCHELASTIC_ERROR_FILE=/job/error.json set by hand (outside torchrun's --log-dir tree): torchelastic's
    record (errors/error_handler.py: message, extraInfo.py_callstack, timestamp) is the failure."""
    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": {
        "message": "KeyError: 'labels'", "extraInfo": {
            "py_callstack": "Traceback (most recent call last):\n  File \"/job/train.py\", line 3, in f\n"
                            "KeyError: 'labels'\n", "timestamp": "1740881647"}}}))
    report = triage([str(path)])
    assert report.sources[0].shape == "error-file"
    v = report.verdict
    assert v.primary is not None and (v.primary.kind, v.primary.message) == ("error-file", "KeyError: 'labels'")
    assert v.primary.time == 1740881647.0


def test_a_file_named_twice_is_read_once(tmp_path: Path) -> None:
    """`mldebug logs job.log logs/*.log` where the glob names job.log again: one source, one failure."""
    log = _write(tmp_path, "\n".join(HEAD + TB_A))
    report = triage([log, str(tmp_path / "*.log"), str(tmp_path)])
    assert [s.path for s in report.sources] == [log]
    assert len([e for e in report.events if e.kind == "traceback"]) == 1


def test_a_glob_that_matches_nothing_is_said_not_read(tmp_path: Path) -> None:
    log = _write(tmp_path, "\n".join(HEAD + TB_A))
    report = triage([log, str(tmp_path / "slurm-*.out")])
    assert report.skipped == [{"path": str(tmp_path / "slurm-*.out"), "reason": "no file matches this pattern"}]
    assert not report.ok and report.summary.endswith("; 1 source(s) not read"), report.summary


def test_a_fifo_is_refused_when_named_and_skipped_in_a_directory(tmp_path: Path) -> None:
    """A FIFO waits for a writer forever: named, it is a usage error before anything is read; in a directory, or
    matched by a glob, it is said not read, and the other logs are."""
    fifo = tmp_path / "live.log"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a log file"):
        triage([str(fifo)])
    _write(tmp_path, "\n".join(HEAD + TB_A))
    for arg in (str(tmp_path), str(tmp_path / "*.log")):
        report = triage([arg])
        assert report.skipped == [{"path": str(fifo), "reason": "not a regular file"}], arg
        assert report.verdict.primary is not None and report.verdict.primary.message == VALUE_ERROR, arg
