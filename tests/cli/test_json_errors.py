"""One answer for scripts, and bad input refused before anything starts.

Every command's error paths, each run twice through the real CLI entry (`ml_debug.cli.app.run`, in this
process: each case ends before anything starts, so no subprocess is needed): without --json, one
`mldebug: error:` line and a hint on stderr and nothing on stdout; with --json, the same lines on stderr
and exactly one JSON document on stdout that validates against ml_debug/schemas/error.json, with
`result.ok` false and the exit code. Then an internal error, an interrupt by SIGTERM, and a SIGTERM to
running commands (exec, logs) in subprocesses: exit 130 with the signal named, like Ctrl-C.

Then the success path of every command (docs/conventions.md, "JSON output"): the cheapest one of each, run
here with --json, prints exactly one document that validates against the command's own schema; a command
whose success needs a job is named with the existing test that checks its document.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from ml_debug.cli.app import run
from ml_debug.core import lifecycle, output
from tests.conftest import REPO, pids_with_env, validate_schema, wait_until
from tests.fakes import pythonpath, signal_at_start


@pytest.fixture(scope="module")
def odd(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Hostile inputs: a FIFO (opening it for reading waits for a writer), a loop of links, a garbage key."""
    d = tmp_path_factory.mktemp("odd")
    os.mkfifo(d / "fifo")
    os.symlink(d / "loop-b", d / "loop-a")
    os.symlink(d / "loop-a", d / "loop-b")
    (d / "garbage.key").write_bytes(bytes(range(256)) * 4)
    return {"fifo": str(d / "fifo"), "loop": str(d / "loop-a"), "key": str(d / "garbage.key"), "dir": str(d)}


@pytest.fixture(autouse=True)
def _output_mode_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """run() in this process sets the output mode (--json): other tests in this worker see it as it was."""
    for name in ("json", "debug", "documents"):
        monkeypatch.setattr(output.MODE, name, getattr(output.MODE, name))


LONG_HOST = "h" * 300

# (command line, exit code, words the error says); {fifo} {loop} {key} name the odd inputs above.
CASES = [
    (["check", "--skip", ""], 2, "--skip is empty"),  # the options layer, for every option
    (["check", "--skip", ",,,"], 2, "--skip ',,,' names no step"),
    (["env", "--no-such-option"], 2, "No such option"),
    (["gpu-test", "--backend", ""], 2, "--backend is empty"),
    (["gpu-test", "--device", ""], 2, "--device is empty"),
    (["gpu-test", "--device", "cpu", "--nproc-per-node", "100000"], 2, "more ranks than this node can run"),
    (["allreduce-bench", "--backend", " "], 2, "--backend is empty"),
    (["allreduce-bench", "--device", "cpu", "--nproc-per-node", "100000"], 2, "more ranks than this node can run"),
    (["train", "--device", "cpu", "--nproc-per-node", "100000"], 2, "more ranks than this node can run"),
    (["train", "--inject", "exit@step=1,rank=0,code=999"], 2, "code=999 is not an exit code"),
    (["train", "--device", ""], 2, "--device is empty"),
    (["health", "--hosts", "/dev/zero"], 2, "hostfile '/dev/zero' is a character device"),
    (["dump-stacks", "--hosts", "{fifo}"], 2, "is a FIFO (named pipe), not a file"),
    (["dump-stacks", "--hosts", LONG_HOST], 2, "is not a valid host name"),
    (["dump-stacks", "--hosts", "localhost", "-i", "{key}"], 2, "is not a private key"),
    (["dump-stacks", "--hosts", "localhost", "-i", "{fifo}"], 2, "is a FIFO (named pipe), not a file"),
    (["dump-stacks", "--hosts", "localhost", "--ssh-config", "{fifo}"], 2, "is a FIFO (named pipe), not a file"),
    (["dump-stacks", "--hosts", "localhost", "--ssh-config", "/dev/zero"], 2, "is a character device"),
    (["dump-stacks", "--hosts", "localhost", "--ssh-config", "{loop}"], 2, "is a loop of symbolic links"),
    (["dump-stacks", "--local", "--out-dir", "/proc/self"], 2, "cannot create a file there"),
    (["core-bt", "{fifo}"], 2, "FIFO"),
    (["trace", "--no-such-option"], 2, "No such option"),
    (["trace-tail", "/dev/zero"], 2, "character device"),
    (["exec", "--hosts", "/dev/zero", "--", "true"], 2, "is a character device"),
    (["logs", "{fifo}"], 2, "is a FIFO (named pipe), not a log file"),
    (["logs", "/dev/zero"], 2, "is a character device, not a log file"),
    (["launch", "--nproc-per-node", "2", "--rdzv-endpoint", "nohostport", "--", "python", "x.py"], 2,
     "--rdzv-endpoint 'nohostport' is not HOST:PORT"),
    (["launch", "--nproc-per-node", "100000", "--", "python", "x.py"], 2, "more ranks than this node can run"),
    (["top", "--local", "--progress-file", ""], 2, "--progress-file is empty"),
    (["top", "--local", "--progress-file", "{{rank"], 2, "an unclosed { or }"),
    (["watch", "--local", "--progress-file", ""], 2, "--progress-file is empty"),
    (["drill", "--slurm-partition", ""], 2, "--slurm-partition is empty"),
    (["no-such-command"], 2, "No such command"),
]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = run(argv)
    got = capsys.readouterr()
    return code, got.out, got.err


@pytest.mark.parametrize("argv, code, words", CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_every_error_is_one_line_and_with_json_one_error_document(argv: list[str], code: int, words: str,
                                                                  odd: dict[str, str], tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # nothing may be written here
    monkeypatch.delenv("MLDEBUG_JSON", raising=False)
    argv = [a.format(**odd) for a in argv]
    got, out, err = _run(argv, capsys)
    assert got == code, err
    assert out == "" and err.startswith("mldebug: error: ") and words in err.splitlines()[0], err
    got, out, err_json = _run(["--json", *argv], capsys)
    assert got == code and err_json == err
    doc = json.loads(out)  # exactly one document
    validate_schema(doc, "error")
    result = doc["result"]
    assert result["ok"] is False and result["exit_code"] == code and words in result["summary"]
    assert result["error"]["kind"] == "usage" and result["error"]["hint"]
    assert result["command"] == (argv[0] if argv[0] != "no-such-command" else None)
    assert list(tmp_path.iterdir()) == [], "something was started or written"


def test_an_internal_error_and_an_interrupt_are_one_document_too(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import ml_debug.cli.env as env_command

    def broken(*_: object, **__: object) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(env_command, "env_command", broken)
    code, out, err = _run(["env", "--json"], capsys)
    assert code == 1 and "mldebug: error: internal error: RuntimeError: a bug" in err
    doc = json.loads(out)
    validate_schema(doc, "error")
    assert doc["result"]["error"]["kind"] == "internal" and doc["result"]["exit_code"] == 1

    def terminated(*_: object, **__: object) -> int:
        lifecycle.note(signal.SIGTERM)  # what the SIGTERM handler records before it interrupts
        raise KeyboardInterrupt

    monkeypatch.setattr(env_command, "env_command", terminated)
    monkeypatch.setattr(lifecycle, "_received", [])
    code, out, err = _run(["--json", "env"], capsys)
    assert code == 130 and err == "mldebug: error: interrupted by SIGTERM\n"
    doc = json.loads(out)
    validate_schema(doc, "error")
    assert doc["result"]["error"] == {"kind": "interrupted", "message": "interrupted by SIGTERM", "hint": None,
                                      "signal": "SIGTERM"}
    assert output.MODE.documents == 1


MARKER = "MLDEBUG_JSON_ERRORS_TEST"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.mark.parametrize("argv", [["exec", "--local", "--", "sleep", "60"], ["logs", "-"]], ids=["exec", "logs"])
def test_sigterm_ends_a_running_command_like_ctrl_c(argv: list[str]) -> None:
    """`timeout` and `scancel` send SIGTERM first: the command stops what it started and says so (exit 130),
    with one JSON document."""
    token = uuid.uuid4().hex
    env = {**os.environ, MARKER: token}
    env["PYTHONPATH"] = pythonpath(env)
    proc = subprocess.Popen([sys.executable, "-m", "ml_debug", "--json", *argv], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        if argv[0] == "exec":  # its `sleep` runs
            # `sleep` itself, exec'd (a child between fork and exec still has mldebug's command line)
            wait_until(lambda: any(_comm(p) == "sleep" for p in pids_with_env(MARKER, token)), 30, "sleep to start")
        else:  # it reads standard input, which stays open
            assert proc.stdin is not None
            proc.stdin.write("[node1:0 rank0]: step 1\n")
            proc.stdin.flush()
            wait_until(lambda: "pipe" in Path(f"/proc/{proc.pid}/wchan").read_text(), 30, "logs to wait on its input")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert "interrupted by SIGTERM" in err, err
        doc = json.loads(out)
        if doc["schema"] == "mldebug.error":
            validate_schema(doc, "error")
            assert doc["result"]["error"]["signal"] == "SIGTERM"
        else:  # the command's own document, marked as interrupted
            assert doc["result"]["ok"] is False, doc["result"]
        wait_until(lambda: not pids_with_env(MARKER, token), 10, "nothing left running")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_while_the_command_starts_its_child_leaves_no_child(sig: str, tmp_path: Path) -> None:
    """The instant after Popen returned, before mldebug holds the child (a hook signals mldebug there,
    tests/fakes/signal_at_start.py): the interrupt still finds the child and stops it. Exit 130, one JSON
    document, and exec's `sleep` (in a session of its own) is gone."""
    token = uuid.uuid4().hex
    pids = tmp_path / "pids"
    env = {**os.environ, MARKER: token, **signal_at_start.env(sig, "sleep", pids)}
    try:
        r = subprocess.run([sys.executable, "-m", "ml_debug", "--json", "exec", "--local", "--", "sleep", "60"],
                           capture_output=True, text=True, env=env, timeout=120)
        assert pids.read_text().strip().isdigit(), "the hook did not signal at the start of the sleep"
        assert r.returncode == 130, r.stderr
        assert ("interrupted by SIGTERM" if sig == "SIGTERM" else "interrupted") in r.stderr, r.stderr
        doc = json.loads(r.stdout)  # one document, nothing else
        if doc["schema"] == "mldebug.error":
            validate_schema(doc, "error")
            assert doc["result"]["error"]["signal"] == sig
        else:  # exec's own report, the node marked as interrupted
            validate_schema(doc, "exec")
            assert doc["result"]["ok"] is False, doc["result"]
        wait_until(lambda: not pids_with_env(MARKER, token), 10, "no child left running")
    finally:
        for pid in pids_with_env(MARKER, token):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_an_allocation_that_fails_is_a_problem_found_not_unreachable_ranks() -> None:
    """`--mem-gb 1e6` fails the alloc stage before the ranks meet: exit 1 naming the allocation (it was exit 4,
    "could not reach the other ranks"), one error document. One rank of a 1-rank world shows the rank's path."""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = pythonpath(env)
    proc = subprocess.run([sys.executable, "-m", "ml_debug", "gpu-test", "--backend", "gloo", "--device", "cpu",
                           "--mem-gb", "1e6", "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "could not reach" not in proc.stderr and "alloc failed: could not allocate 1e+06 GiB" in proc.stderr
    doc = json.loads(proc.stdout)
    validate_schema(doc, "error")
    assert doc["result"]["exit_code"] == 1 and doc["result"]["error"]["kind"] == "problem"


# --------------------------------------------------------------------- one success path of every command

# A command whose success path needs a job, a hung process, a core, a GPU stage or a server: an existing test
# already runs it with --json, reads ALL of stdout as one document (json.loads of the whole of it) and validates
# it against the command's schema. Named here rather than started again (each is a job of seconds to minutes).
SUCCESS_ELSEWHERE = {
    "check": "cli/test_check.py::test_check_runs_env_alone_with_the_other_steps_skipped",
    "gpu-test": "cli/test_gpu_test.py::test_torchrun_two_ranks",
    "allreduce-bench": "cli/test_allreduce_bench.py::test_self_launched_two_ranks_quick_every_collective_csv_and_plot",
    "health": "unit/health/test_host.py::test_level1_without_gpu_says_so_and_exit_code_follows_host_checks",
    "dump-stacks": "cli/test_dump_stacks.py::test_local_names_the_odd_rank_and_function_and_reports_what_it_cannot_dump",
    "core-bt": "cli/test_core_bt.py::test_core_bt_shows_the_crashing_c_frame_and_the_python_frames",
    "train": "cli/test_train.py::test_golden_run_its_metrics_and_a_bit_identical_resume",
    "watch": "cli/test_watch.py::test_a_hung_rank_is_named_in_a_bundle_within_stall_plus_20_s_and_ctrl_c_keeps_the_bundle",
    "drill": "cli/test_drill.py::test_drills_judged_by_stacks_logs_and_links_name_the_injected_rank",
    "exporter": "cli/test_exporter.py::test_once_json_follows_the_schema",
    "attach": "cli/test_attach.py::test_attach_by_pid_reads_a_local_evaluates_and_detaches_leaving_the_loop_running",
}

TRACED = "import os, sys\nprint('the program speaks')\nsys.exit(int(sys.argv[1]))\n"

# The cheapest success path of every other command: (command line, schema, exit code), run in this process
# (trace's own runs the program, in a subprocess: the fixture below). {traces}: the trace files that run
# wrote; {history}: a history database with one check run.
# `launch` runs ranks whose output is its stdout: its one document is the usage error that says so.
SUCCESS = [
    (["env", "--no-torch"], "env", 0),
    (["tflops", "--params", "1B", "--seq-len", "2048", "--global-batch", "8", "--iter-time", "1", "--gpus", "1"],
     "tflops", 0),
    (["history", "--history", "{history}"], "history", 0),
    (["logs", "tests/data/logs/nccl_ib_two_nodes.log"], "logs", 0),
    (["exec", "--local", "--", "true"], "exec", 0),
    # only processes no other test starts: a job of a test on another xdist worker would be judged too (exit 1)
    (["top", "--local", "--once", "--interval", "0.2", "--pattern", "no-such-job-a7f3c2"], "top", 0),
    (["trace-tail", "{traces}"], "trace-tail", 0),
    (["launch", "--nproc-per-node", "1", "--", "x.py"], "error", 2),
]


@dataclass(frozen=True)
class Made:
    """What the success paths read: {dir}, {traces} and {history} of the command lines above, and the run of
    `mldebug trace --json` that wrote the traces (its own success path)."""

    words: dict[str, str]
    trace: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Made:
    from ml_debug.history.store import CheckRow, open_history

    d = tmp_path_factory.mktemp("made")
    (d / "p.py").write_text(TRACED)
    with open_history(d / "history.db") as h:
        h.record_run("node1", "slurm-check", True, "all passed", [CheckRow("gpu.count", "node", "pass", "8", "")])
    env = {**os.environ, "PYTHONPATH": pythonpath(), "OMP_NUM_THREADS": "1"}
    env.pop("MLDEBUG_JSON", None)
    trace = subprocess.run([sys.executable, "-m", "ml_debug", "trace", "--json", "-o", str(d / "traces"), "--",
                            "p.py", "0"], capture_output=True, text=True, timeout=120, cwd=d, env=env)
    return Made({"dir": str(d), "traces": str(d / "traces"), "history": str(d / "history.db")}, trace)


def test_trace_prints_one_document_and_the_programs_output_on_stderr(made: Made) -> None:
    proc = made.trace
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # the program's print is not on stdout
    validate_schema(doc, "trace")
    result = doc["result"]
    assert result["ok"] and result["exit_code"] == 0 and result["program"] == ["p.py", "0"]
    assert Path(result["trace_file"]).parent == Path(made.words["traces"]) and Path(result["trace_file"]).is_file()
    assert "the program speaks" in proc.stderr


@pytest.mark.parametrize("argv, schema, code", SUCCESS, ids=[c[0][0] for c in SUCCESS])
def test_every_command_succeeds_with_one_document_of_its_schema(argv: list[str], schema: str, code: int,
                                                                made: Made, capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLDEBUG_JSON", raising=False)
    monkeypatch.chdir(REPO)
    got, out, err = _run(["--json", *[a.format(**made.words) for a in argv]], capsys)
    assert got == code, err
    doc = json.loads(out)  # exactly one document: a second one, or anything else on stdout, fails here
    validate_schema(doc, schema)
    assert doc["result"]["ok"] is (code == 0)


def test_every_command_is_run_with_json_here_or_by_a_named_test() -> None:
    """A new command joins SUCCESS or SUCCESS_ELSEWHERE; a renamed test there is noticed."""
    from ml_debug.cli.app import COMMANDS

    here = {argv[0] for argv, _, _ in SUCCESS} | {"trace"}
    assert set(COMMANDS) == here | set(SUCCESS_ELSEWHERE), set(COMMANDS) ^ (here | set(SUCCESS_ELSEWHERE))
    def found(name: str) -> bool:
        path, _, function = name.partition("::")
        module = REPO / "tests" / path
        return module.is_file() and f"def {function}(" in module.read_text()

    missing = [name for name in SUCCESS_ELSEWHERE.values() if not found(name)]
    assert not missing, f"named above but not found under tests/: {missing}"
