"""`mldebug logs` / `mldebug launch` on the shapes a user audit found mishandled: long --rank output,
colour codes, time stamps in front of tracebacks, long messages, clean logs, Python's start-up
errors, interrupted and restarted `mldebug launch` jobs, a --log-dir with spaces."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ml_debug.logs.triage import MAX_DEMUX_LINES, demux, triage
from tests.conftest import REPO, pids_with_env, validate_schema, wait_until
from tests.fakes import hooks_env


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLDEBUG_JSON", "COLUMNS")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "ml_debug", *args], capture_output=True, text=True, timeout=60,
                          env=env, cwd=cwd)


def test_the_lines_of_a_rank_are_never_cut(tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    n = MAX_DEMUX_LINES + 1
    log.write_text("".join(f"0: step {i}\n" for i in range(n)) + "1: other rank\n")
    got = _cli("logs", str(log), "--rank", "0")
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    assert len(lines) == n and lines[-1] == f"step {n - 1}"
    # a caller that keeps the lines (the JSON document) gives a bound, and is told it was reached
    kept: list[str] = []
    out = demux([str(log)], rank=0, node=None, emit=lambda s, i, text: kept.append(text), limit=2)
    assert kept == ["step 0", "step 1"] and out["truncated"] is True


def test_colour_codes_do_not_mangle_messages(tmp_path: Path) -> None:
    log = tmp_path / "py313.out"
    log.write_text(
        "0: \x1b[1;35mConnectionResetError\x1b[0m: \x1b[35mConnection reset by peer\x1b[0m\n"
        "1: Traceback (most recent call last):\n"
        '1:   File \x1b[35m"<string>"\x1b[0m, line \x1b[35m4\x1b[0m, in \x1b[35m<module>\x1b[0m\n'
        "1: \x1b[1;35mValueError\x1b[0m: \x1b[35mbad shape on rank 1\x1b[0m\n"
        "2: \x1b[1;31mRuntimeError: CUDA error: an illegal memory access was encountered\x1b[0m\n"
        "3: \x1b]8;;http://x\x07step 1\x1b]8;;\x07\n")
    report = triage([str(log)])
    messages = {e.who.rank: e.message for e in report.events}
    assert messages[1] == "ValueError: bad shape on rank 1"
    assert messages[2] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert report.verdict.primary is not None and report.verdict.primary.who.rank == 1, report.verdict.summary


@pytest.mark.parametrize("stamp", ["2026-11-25T04:00:{s}.123456789Z ", "[2026-11-25 04:00:{s}] ",
                                   "Nov 25 04:00:{s} "])
def test_a_time_stamp_in_front_of_a_traceback(tmp_path: Path, stamp: str) -> None:
    """kubectl logs --timestamps, docker logs -t, `| ts`, a logger's [date]: rank 3's traceback comes first."""
    for rank in range(4):
        lines = [f"{stamp.format(s='00')}step {i} loss 2.3" for i in range(3)]
        if rank == 3:
            lines += [stamp.format(s="01") + "Traceback (most recent call last):",
                      stamp.format(s="01") + '  File "t.py", line 1, in <module>',
                      stamp.format(s="01") + "ValueError: bad batch",
                      stamp.format(s="02") + "rank 3: Connection reset by peer while saving"]
        if rank == 1:
            lines.append(stamp.format(s="03") + "RuntimeError: CUDA error: an illegal memory access was encountered")
        if rank in (0, 2):
            lines.append(stamp.format(s="06") + "RuntimeError: Connection closed by peer")
        (tmp_path / f"rank{rank}.log").write_text("\n".join(lines) + "\n")
    report = triage([str(tmp_path)])
    p = report.verdict.primary
    assert p is not None and p.who.rank == 3 and p.message == "ValueError: bad batch", report.verdict.summary
    assert p.kind == "traceback" and p.text[-1] == "ValueError: bad batch" and "at 04:00:01" in report.verdict.summary


def test_a_long_message_is_marked_cut_and_kept_whole_in_json(tmp_path: Path) -> None:
    log = tmp_path / "long.out"
    message = "RuntimeError: CUDA error: " + "x" * 400 + " END"
    log.write_text(f"0: {message}\n1: RuntimeError: Connection reset by peer\n")
    human = _cli("logs", str(log))
    assert human.returncode == 1
    assert "x…" in human.stdout.splitlines()[0] and " END" not in human.stdout.splitlines()[0]
    doc = json.loads(_cli("--json", "logs", str(log)).stdout)
    validate_schema(doc, "logs")
    assert doc["result"]["verdict"]["primary"]["message"] == message


@pytest.mark.parametrize("label", ["{r}: ", "[default{r}]:"])
def test_ranks_are_seen_in_logs_without_failures(tmp_path: Path, label: str) -> None:
    log = tmp_path / "clean.out"
    log.write_text("".join(f"{label.format(r=r)}step 1\n" for r in range(4)))
    report = triage([str(log)])
    assert report.verdict.status == "none"
    if label.startswith("[default"):  # local ranks of one agent: which node, and how many nodes, is not said
        assert report.ranks_seen == "" and report.sources[0].view == "local ranks 0-3 of one node (which is not said)"
    else:
        assert report.ranks_seen == "0-3" and report.world_size == 4


def test_pythons_start_up_errors_are_named(tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    log.write_text("0: python3: can't open file '/x/nonexist.py': [Errno 2] No such file or directory\n"
                   "1: /usr/bin/python3: No module named nonexist_mod\n"
                   "E1125 22:47:36.1 1 api.py:1] failed (exitcode: 2) local_rank: 0 (pid: 7) of binary: python3\n")
    report = triage([str(log)])
    primary = {e.who.rank: e.message for e in report.events if e.strong}
    assert primary[0] == "python3: can't open file '/x/nonexist.py': [Errno 2] No such file or directory"
    assert primary[1] == "python3: No module named nonexist_mod"
    assert report.verdict.primary is not None and "can't open file" in report.verdict.summary


def _launch_dir(root: Path, exit_code: int, console: str) -> Path:
    node = root / "vm"
    node.mkdir(parents=True)
    (node / "launch.json").write_text(json.dumps({"schema": "mldebug.launch", "schema_version": 1, "node": "vm",
                                                  "nnodes": "1", "nproc_per_node": "2", "exit_code": exit_code}))
    (node / "console.log").write_text(console)
    return node


def test_a_launch_stopped_with_ctrl_c_is_not_a_failure(tmp_path: Path) -> None:
    tb = "".join(f'[vm:{r} rank{r}]:Traceback (most recent call last):\n[vm:{r} rank{r}]:  File "s.py", line 3\n'
                 f"[vm:{r} rank{r}]:KeyboardInterrupt\n" for r in range(2))
    _launch_dir(tmp_path, 130, "W1125 22:48:49.9 1 api.py:1] Sending process 21689 closing signal SIGINT\n" + tb)
    got = _cli("logs", str(tmp_path))
    assert got.returncode == 0, got.stdout
    assert got.stdout.startswith("the job was stopped by the user (Ctrl-C"), got.stdout
    assert triage([str(tmp_path)]).verdict.status == "interrupted"


def test_a_launch_that_restarted_and_succeeded_recovered(tmp_path: Path) -> None:
    tb = ("Traceback (most recent call last):\n  File \"r.py\", line 5, in <module>\n"
          "ValueError: transient failure on rank 1\n")
    node = _launch_dir(tmp_path, 0, "".join(f"[vm:1 rank1]:{ln}\n" for ln in tb.splitlines())
                       + "[vm:1 rank1]:ok\n[vm:0 rank0]:ok\n")
    tree = node / "torchelastic" / "x_1"
    for attempt, rank, name, text in [(0, 1, "stderr.log", tb), (1, 0, "stdout.log", "ok\n"),
                                      (1, 1, "stdout.log", "ok\n")]:
        (tree / f"attempt_{attempt}" / str(rank)).mkdir(parents=True, exist_ok=True)
        (tree / f"attempt_{attempt}" / str(rank) / name).write_text(text)
    got = _cli("logs", str(tmp_path))
    assert got.returncode == 0, got.stdout
    assert got.stdout.startswith("the job recovered: the failure of attempt 0 was followed by a successful "
                                 "attempt 1"), got.stdout
    doc = json.loads(_cli("--json", "logs", str(tmp_path)).stdout)
    validate_schema(doc, "logs")
    assert doc["result"]["verdict"]["status"] == "recovered" and doc["result"]["ok"] is True


def test_launch_quotes_the_log_dir_it_names(tmp_path: Path) -> None:
    got = _cli("launch", "--nproc-per-node", "1", "--log-dir", "sp ace/ünï", "--no-verdict", "--",
               sys.executable, "-c", "pass", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    said = next(ln for ln in got.stderr.splitlines() if "read the logs with:" in ln)
    command = said.split("read the logs with: ", 1)[1]
    assert shlex.split(command) == ["mldebug", "logs", str(tmp_path / "sp ace" / "ünï")]


def test_reader_processes_give_the_same_document_and_ignore_the_working_directory(tmp_path: Path) -> None:
    """`mldebug logs --readers 2` (the installed command, as a user runs it) writes the document `--readers 1` writes;
    its readers do not import from the working directory (a job user's, when root reads their logs)."""
    planted = tmp_path / "ml_debug"
    planted.mkdir()
    (planted / "__init__.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    corpus = str(REPO / "tests" / "data" / "logs_corpus")
    mldebug = str(Path(sys.executable).parent / "mldebug")
    env = {k: v for k, v in os.environ.items() if k not in ("MLDEBUG_JSON", "COLUMNS", "PYTHONPATH")}
    docs = []
    for jobs in ("1", "2"):
        run = subprocess.run([mldebug, "--json", "logs", "--readers", jobs, corpus], capture_output=True, text=True,
                             timeout=60, env=env, cwd=tmp_path)
        assert run.returncode == 1, run.stderr
        doc = json.loads(run.stdout)
        validate_schema(doc, "logs")
        docs.append(doc["result"])
    assert docs[0] == docs[1] and docs[0]["verdict"]["primary"] is not None
    assert not (tmp_path / "imported").exists()


def test_sigterm_ends_mldebug_and_its_readers() -> None:
    """`timeout`/`scancel` while reader processes are stuck (a dead file system): exit 130, one document,
    and no reader left."""
    token = f"readers-{os.getpid()}"
    env = {**os.environ, "MLDEBUG_LOGS_READERS_TEST": token,
           **hooks_env("tests.fakes.logs_readers", {"MLDEBUG_FAKE_READER": "stall"})}
    proc = subprocess.Popen([sys.executable, "-m", "ml_debug", "--json", "logs", "--readers", "2",
                             str(REPO / "tests" / "data" / "logs_corpus")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_until(lambda: len(pids_with_env("MLDEBUG_LOGS_READERS_TEST", token)) == 3, 30, "two readers to start")
        proc.terminate()
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130 and "interrupted by SIGTERM" in err, err
        validate_schema(json.loads(out), "error")
        wait_until(lambda: not pids_with_env("MLDEBUG_LOGS_READERS_TEST", token), 10, "no reader left")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_an_archive_of_a_jobs_logs_on_the_command_line(tmp_path: Path) -> None:
    """`mldebug logs job.tar.gz`: read as its directory (exit 1: a failure found, named under the archive's name); an
    archive of a compression Python cannot read: exit 2, and how to unpack it."""
    import tarfile

    job = REPO / "tests" / "data" / "logs" / "launch_nan_rank1_stopped_first"
    with tarfile.open(tmp_path / "job.tar.gz", "w:gz") as tar:
        tar.add(job, arcname="logs")
    got = _cli("--json", "logs", str(tmp_path / "job.tar.gz"))
    assert got.returncode == 1, got.stderr
    result = json.loads(got.stdout)["result"]
    assert result["verdict"]["primary"]["who"]["rank"] == 1 and result["verdict"]["primary"]["source"].startswith(
        f"{tmp_path}/job.tar.gz/logs/vm/"), result["verdict"]
    (tmp_path / "job.7z").write_bytes(b"7z\xbc\xaf\x27\x1c")
    got = _cli("logs", str(tmp_path / "job.7z"))
    assert got.returncode == 2 and f"7z x {tmp_path}/job.7z, then give the directory" in got.stderr, got.stderr
