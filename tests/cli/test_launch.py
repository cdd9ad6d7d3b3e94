"""`mldebug launch` refuses bad input with one usage line, before it makes a log directory or starts torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ml_debug.core.errors import UsageError
from ml_debug.launch.options import LaunchJobOptions, parse_nnodes, parse_nproc_per_node
from ml_debug.launch.run import plan, prepare


def _launch(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLDEBUG_JSON", "MLDEBUG_LOG_DIR")}
    return subprocess.run([sys.executable, "-m", "ml_debug", "launch", *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd, env=env)


@pytest.mark.parametrize(("word", "value"), [("4", "4"), ("04", "4"), ("gpu", "gpu"), ("cpu", "cpu"),
                                             ("auto", "auto")])
def test_nproc_per_node_takes_what_torchrun_takes(word: str, value: str) -> None:
    assert parse_nproc_per_node(word) == value


@pytest.mark.parametrize(("word", "value"), [("1", "1"), ("2", "2"), ("2:4", "2:4"), ("3:3", "3:3")])
def test_nnodes_takes_what_torchrun_takes(word: str, value: str) -> None:
    assert parse_nnodes(word) == value


@pytest.mark.parametrize("word", ["0", "-1", "abc", "1.5", ""])
def test_a_bad_nproc_per_node_is_refused(word: str) -> None:
    with pytest.raises(UsageError):
        parse_nproc_per_node(word)


@pytest.mark.parametrize("word", ["0", "-1", "abc", "4:2", "0:2", "1:2:3", ":", ""])
def test_a_bad_nnodes_is_refused(word: str) -> None:
    with pytest.raises(UsageError):
        parse_nnodes(word)


@pytest.mark.parametrize("args", [
    ("--nproc-per-node", "0", "--log-dir", "L0"),
    ("--nnodes", "abc", "--log-dir", "L0"),
    ("--log-dir", ""),
    ("--log-dir", "/proc/nope"),
    ("--trace", "--log-dir", "L0", "--", "python", "-c", "print(1)"),
    ("--json", "--log-dir", "L0"),  # accepted and ignored: the job ran, no document came
])
def test_bad_input_is_one_usage_line_and_creates_nothing(tmp_path: Path, args: tuple[str, ...]) -> None:
    (tmp_path / "ok.py").write_text("print('ok')\n")
    cmd = args if "--" in args else (*args, "--", "python", "ok.py")
    got = _launch(tmp_path, *cmd)
    assert got.returncode == 2, got.stderr
    lines = got.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("mldebug: error: ") and lines[1].startswith("hint: "), got.stderr
    if "--json" in args:  # refused, and said in the one document a --json run prints
        assert json.loads(got.stdout)["result"]["error"]["kind"] == "usage"
    else:
        assert got.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.py"]


def test_an_unwritable_log_dir_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    p = plan(LaunchJobOptions(command=["t.py"], log_dir=tmp_path / "file" / "sub"), host="h")
    with pytest.raises(UsageError, match="cannot write the logs"):
        prepare(p)


def test_python_with_options_of_its_own_runs_as_written(tmp_path: Path) -> None:
    """torchrun would take `-c` for its own option: the Python and its options run as a program."""
    p = plan(LaunchJobOptions(command=["python", "-c", "print(1)"], log_dir=tmp_path), host="h")
    assert p.argv[-4:] == ["--no-python", "python", "-c", "print(1)"]
    x = plan(LaunchJobOptions(command=["python3", "-X", "dev", "t.py"], log_dir=tmp_path), host="h")
    assert x.argv[-5:] == ["--no-python", "python3", "-X", "dev", "t.py"]
    u = plan(LaunchJobOptions(command=["python", "-u", "-m", "pkg", "-c", "x"], log_dir=tmp_path), host="h")
    assert u.argv[-4:] == ["-m", "pkg", "-c", "x"] and "--no-python" not in u.argv
    s = plan(LaunchJobOptions(command=["python", "t.py", "-c", "x"], log_dir=tmp_path), host="h")
    assert s.argv[-3:] == ["t.py", "-c", "x"] and "--no-python" not in s.argv


def test_nproc_per_node_gpu_without_a_gpu_is_one_line_exit_3(tmp_path: Path) -> None:
    """torchrun's own answer was its traceback ("ValueError: Cuda is not available.") after the log
    directory was made. CUDA_VISIBLE_DEVICES='' hides any GPU, so the node has none on every machine."""
    (tmp_path / "ok.py").write_text("print('ok')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("MLDEBUG_JSON", "MLDEBUG_LOG_DIR")}
    got = subprocess.run([sys.executable, "-m", "ml_debug", "launch", "--nproc-per-node", "gpu", "--", "python", "ok.py"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**env, "CUDA_VISIBLE_DEVICES": ""})
    assert got.returncode == 3, got.stderr
    lines = got.stderr.splitlines()
    assert len(lines) == 2 and lines[0] == "mldebug: error: --nproc-per-node gpu: this node has no GPU that torch " \
        "can use" and lines[1].startswith("hint: "), got.stderr
    assert got.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["ok.py"]
