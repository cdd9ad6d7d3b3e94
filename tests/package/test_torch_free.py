"""`pip install mldebug` without PyTorch: the torch-free commands run, the others say which extra
to install and exit 3. PyTorch is hidden from the CLI's process the way a missing package looks to
Python (`import torch` raises ModuleNotFoundError; `importlib.util.find_spec` finds nothing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tests.conftest import REPO

WITHOUT_TORCH = ("import sys; sys.modules['torch'] = None; sys.modules['numpy'] = None; "
                 "sys.argv = ['mldebug', *sys.argv[1:]]; from ml_debug.cli.app import main; main()")


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT_TORCH, *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd or REPO, env={**os.environ, "MLDEBUG_WIDTH": "160", "PYTHONPATH": str(REPO)})


def test_torch_is_an_extra_not_a_dependency() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [d.split(">")[0].split("=")[0].split("<")[0].strip() for d in project["dependencies"]]
    assert "torch" not in names and "numpy" not in names
    extras = project["optional-dependencies"]
    assert any(d.startswith("torch") for d in extras["torch"])
    assert any(d.startswith("torch") for d in extras["test"])  # tests/run.sh installs '.[test]'


@pytest.mark.parametrize("args", [
    ("gpu-test",), ("allreduce-bench", "--quick"), ("train", "--steps", "1"), ("health", "--level", "2"),
])
def test_commands_that_need_torch_name_the_extra_and_exit_3(args: tuple[str, ...]) -> None:
    proc = _run(*args)
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("mldebug: error: ") and "needs PyTorch" in lines[0], proc.stderr
    assert lines[1].startswith("hint: pip install 'mldebug[torch]'"), proc.stderr
    assert len(lines) == 2 and "Traceback" not in proc.stderr


def test_torch_free_commands_run_without_torch(tmp_path: Path) -> None:
    env = _run("env", "--no-torch")
    assert env.returncode == 0, env.stderr
    health = _run("health", "--path", str(tmp_path))
    assert health.returncode in (0, 1) and "Traceback" not in health.stderr, health.stderr
    assert "pass" in health.stdout
    log = tmp_path / "job.log"
    log.write_text("[node7:0]:[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered\n")
    logs = _run("logs", str(log))
    assert logs.returncode == 1 and "illegal memory access" in logs.stdout, logs.stderr
