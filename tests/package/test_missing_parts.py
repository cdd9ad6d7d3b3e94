"""An install that lacks an optional part: every command that needs it exits 3 naming the part and the
command that installs it, never with an `internal error`; `mldebug check` marks the step and exits 3; a
torch-free install runs what needs no torch and says what it skipped.

Each environment is real (tests/package/envs.py): a venv without the distribution's files, or a PATH
without the program. Nothing is patched in the process under test.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import tomllib

from ml_debug.core.extras import PARTS
from tests.conftest import REPO, require
from tests.package.envs import ScratchEnv, scratch_env

SCHEMAS = REPO / "ml_debug" / "schemas"
TORCH_COMMANDS = [("gpu-test",), ("allreduce-bench", "--quick"), ("train", "--steps", "1"),
                  ("health", "--level", "2"), ("drill",)]
# environment name -> (distributions left out, programs left off PATH)
ENVS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "torch": (("torch", "numpy", "torchao"), ()),  # the torch-free install of the nodes
    "numpy": (("numpy",), ()),
    "pystack": (("pystack",), ()),
    "debugpy": (("debugpy",), ()),
    "matplotlib": (("matplotlib",), ()),
    "torchao": (("torchao",), ()),
    "prometheus_client": (("prometheus_client",), ()),
    "py-spy": (("py-spy",), ()),
    "gdb": ((), ("gdb",)),
    "gdb+pystack": (("pystack",), ("gdb",)),  # core-bt reads a core with either
}
# (environment, the part it lacks, a command that needs it); {pid}: a live Python process, {core}: a core file
CASES = [
    *[("torch", "torch", args) for args in TORCH_COMMANDS],
    *[("numpy", "numpy", args) for args in TORCH_COMMANDS],
    ("torch", "torch", ("launch", "--nproc-per-node", "1", "{tmp}/job.py")),
    ("pystack", "pystack", ("dump-stacks", "--pid", "{pid}", "--dumper", "pystack")),
    ("debugpy", "debugpy", ("attach", "--pid", "{pid}")),
    ("debugpy", "debugpy", ("train", "--steps", "1", "--nproc-per-node", "1", "--debug-rank", "0")),
    ("debugpy", "debugpy", ("launch", "--debug-rank", "0", "--nproc-per-node", "1", "{tmp}/job.py")),
    ("matplotlib", "matplotlib", ("allreduce-bench", "--quick", "--plot", "{tmp}/bw.png")),
    ("torchao", "torchao", ("train", "--steps", "1", "--numerics", "fp8")),
    ("prometheus_client", "prometheus_client", ("exporter", "--once")),
    ("py-spy", "py-spy", ("dump-stacks", "--pid", "{pid}")),
    ("py-spy", "py-spy", ("watch", "--pid", "{pid}", "--now", "--out-dir", "{tmp}/incident")),
    ("gdb", "gdb", ("dump-stacks", "--pid", "{pid}", "--dumper", "gdb")),
    ("gdb", "gdb", ("attach", "--pid", "{pid}")),
    ("gdb+pystack", "gdb", ("core-bt", "{core}")),
]


@pytest.fixture(scope="module")
def envs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ScratchEnv]:
    root = tmp_path_factory.mktemp("envs")
    return {name: scratch_env(root / name.replace("+", "-"), dists, programs)
            for name, (dists, programs) in ENVS.items()}


@pytest.fixture(scope="module")
def target() -> Iterator[int]:
    """A live Python process for the stack and attach commands (they stop before touching it)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real core file: a Python process that aborts in a directory of its own."""
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    require(not pattern.startswith(("|", "/")), f"core_pattern writing plain files in the cwd (it is {pattern!r})")
    cwd = tmp_path_factory.mktemp("core")
    subprocess.run([sys.executable, "-c", "import os; os.abort()"], cwd=cwd, capture_output=True,
                   preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY,) * 2))
    cores = list(cwd.iterdir())
    require(cores, f"a core file in {cwd} (core_pattern {pattern!r}, ulimit -c)")
    return cores[0]


def test_the_environments_lack_exactly_their_part(envs: dict[str, ScratchEnv]) -> None:
    """The test venv's modules are there, the left-out ones are not, as Python and pip see it."""
    probe = ("import importlib.util as u, importlib.metadata as m, shutil, sys\n"
             "for n in sys.argv[1:]: print(n, u.find_spec(n) is not None, shutil.which(n) is not None)")
    for name, want_missing in (("numpy", "numpy"), ("torch", "torch"), ("prometheus_client", "prometheus_client")):
        out = subprocess.run([str(envs[name].python), "-c", probe, "ml_debug", "typer", want_missing],
                             capture_output=True, text=True, env=envs[name].env(), check=True).stdout.split("\n")
        assert out[0].split()[1] == "True" and out[1].split()[1] == "True", out
        assert out[2].split()[1] == "False", out
    assert not (envs["py-spy"].root / "bin" / "py-spy").exists() and (envs["gdb"].root / "bin" / "py-spy").exists()
    which = subprocess.run(["sh", "-c", "command -v gdb || echo none; command -v ls"], capture_output=True,
                           text=True, env=envs["gdb"].env()).stdout.split()
    assert which[0] == "none" and which[1].endswith("/ls"), which


@pytest.mark.parametrize(("env_name", "part", "args"), CASES, ids=lambda v: v if isinstance(v, str) else "-".join(v))
def test_a_missing_part_is_named_with_its_install_command(envs: dict[str, ScratchEnv], target: int, core: Path,
                                                          tmp_path: Path, env_name: str, part: str,
                                                          args: tuple[str, ...]) -> None:
    env = envs[env_name]
    argv = [a.format(pid=target, tmp=tmp_path, core=core) for a in args]
    human = env.mldebug(*argv, cwd=tmp_path)
    assert human.returncode == 3, (human.returncode, human.stderr)
    lines = [ln for ln in human.stderr.splitlines() if ln.startswith(("mldebug: error:", "hint:"))]
    assert lines[0].startswith(f"mldebug: error: missing {part}: "), human.stderr
    assert lines[1].startswith(f"hint: {PARTS[part].install}"), human.stderr
    assert "internal error" not in human.stderr + human.stdout and "Traceback" not in human.stderr

    if argv[0] == "launch":  # its stdout is the job's: no --json (exit 2, said so)
        return
    as_json = env.mldebug("--json", *argv, cwd=tmp_path)
    assert as_json.returncode == 3 and "internal error" not in as_json.stdout + as_json.stderr, as_json.stderr
    doc = json.loads(as_json.stdout)  # one document
    jsonschema.validate(doc, json.loads((SCHEMAS / f"{doc['schema'].removeprefix('mldebug.')}.json").read_text()))
    result = doc["result"]
    if doc["schema"] == "mldebug.error":
        assert result["error"]["kind"] == "environment"
        assert result["details"]["missing"]["name"] == part, result
        assert result["details"]["missing"]["install"] == PARTS[part].install
    else:  # attach's own document, whose error says it (a remote caller reads it there)
        assert doc["schema"] == "mldebug.attach" and result["error"].startswith(f"missing {part}: ")
        assert result["hint"].startswith(PARTS[part].install)


def test_check_without_numpy_marks_the_steps_and_exits_3(envs: dict[str, ScratchEnv], tmp_path: Path) -> None:
    proc = envs["numpy"].mldebug("--json", "check", cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, json.loads((SCHEMAS / "check.json").read_text()))
    steps = {s["name"]: s for s in doc["result"]["steps"]}
    for name in ("gpu-test", "allreduce-bench"):
        assert steps[name]["status"] == "missing" and steps[name]["exit_code"] == 3
        assert steps[name]["summary"] == f"missing numpy: {PARTS['numpy'].install}"
    assert steps["env"]["status"] == "pass" and steps["health"]["status"] == "pass", steps
    assert "internal error" not in proc.stdout


def test_check_on_a_torch_free_install_runs_the_rest_and_names_what_it_skipped(envs: dict[str, ScratchEnv],
                                                                               tmp_path: Path) -> None:
    proc = envs["torch"].mldebug("check", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {ln.split()[0]: ln for ln in proc.stdout.splitlines() if "│" in ln}
    assert " pass " in rows["env"] and " pass " in rows["health"], proc.stdout
    for name in ("gpu-test", "allreduce-bench"):
        assert " skipped " in rows[name] and "pip install 'mldebug[torch]' adds it" in rows[name], proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("OK 2/2 steps passed") and "skipped gpu-test, allreduce-bench" in last, last


def test_torch_free_commands_run_without_torch(envs: dict[str, ScratchEnv], tmp_path: Path) -> None:
    env = envs["torch"]
    report = env.mldebug("--json", "env", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["result"]["packages"]["torch"] is None
    health = env.mldebug("health", "--path", str(tmp_path), cwd=tmp_path)
    assert health.returncode in (0, 1) and "Traceback" not in health.stderr and "pass" in health.stdout, health.stderr
    log = tmp_path / "job.log"
    log.write_text("[node7:0]:[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered\n")
    logs = env.mldebug("logs", str(log), cwd=tmp_path)
    assert logs.returncode == 1 and "illegal memory access" in logs.stdout, logs.stderr


def test_torch_is_an_extra_not_a_dependency() -> None:
    """A node that runs only the Slurm hook installs neither torch nor numpy (docs/install.md says why)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [d.split(">")[0].split("=")[0].split("<")[0].strip() for d in project["dependencies"]]
    assert "torch" not in names and "numpy" not in names
    extras = project["optional-dependencies"]
    assert {d.split(">")[0] for d in extras["torch"]} == {"torch", "numpy"}
    assert any(d.startswith("torch") for d in extras["test"])  # tests/run.sh installs '.[test]'
