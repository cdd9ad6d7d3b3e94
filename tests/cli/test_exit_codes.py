"""Documented behaviour end to end, through the real CLI: the exit codes each command's README section
promises (partial results, missing tools, problems found), `--out-dir`, and the global options
(`--json`, MLDEBUG_JSON, MLDEBUG_DEBUG). Each case uses the cheapest real setup that shows it; `check`
exiting 1 for a failing step, with each step's document under --out-dir, is tests/cli/test_check.py's bench
fault test."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import (
    REPO,
    closed_port,
    mldebug,
    pids_with_env,
    require,
    reserved_port,
    validate_schema,
    wait_until,
)
from tests.fakes import faults

SCHEMAS = REPO / "ml_debug" / "schemas"
VENV_PYTHON = str(REPO / ".venv" / "bin" / "python")
CRASH = "import ctypes\ndef crash_here():\n    ctypes.string_at(0)\ncrash_here()\n"


def _doc(proc: subprocess.CompletedProcess[str], schema: str) -> dict:
    assert proc.stdout.strip(), f"no JSON on stdout (rc {proc.returncode}): {proc.stderr[-2000:]}"
    doc = json.loads(proc.stdout)
    validate_schema(doc, schema)
    return doc


def _bare_python(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """This venv's Python with a PATH of nothing but itself (no gdb, pystack, py-spy, srun, squeue):
    the venv's packages come in through PYTHONPATH."""
    bindir = tmp_path / "bare-bin"
    bindir.mkdir()
    (bindir / "python").symlink_to(os.path.realpath(sys.executable))
    site = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    return str(bindir / "python"), {"PATH": str(bindir), "PYTHONPATH": f"{REPO}:{site}", "HOME": str(tmp_path),
                                    "MLDEBUG_WIDTH": "160"}


# ------------------------------------------------------------------------------ global options


@pytest.mark.parametrize(("args", "code"), [
    (["logs", "tests/data/logs/nan_every_rank_names_rank1.log"], 1),  # a failure found
    (["logs", "tests/data/logs/nccl_ib_two_nodes.log"], 0),  # none found
    (["logs", "--json", "tests/data/logs/nan_every_rank_names_rank1.log"], 1),
    (["env", "--no-torch"], 0),
])
def test_a_reader_that_went_away_leaves_the_exit_code_alone(args: list[str], code: int) -> None:
    """`mldebug logs x | head -1` under pipefail: rich's own broken-pipe handling exited 1 ("a problem was
    found") whatever the verdict. Here the pipe's read end is closed before mldebug writes anything."""
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run([sys.executable, "-m", "ml_debug", *args], stdout=w, stderr=subprocess.PIPE, text=True,
                              timeout=120, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        os.close(w)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr and "error" not in proc.stderr, proc.stderr


def test_global_debug_reaches_the_processes_a_command_starts() -> None:
    """Ranks and local agents print their tracebacks too (only the parent did: `mldebug --debug
    allreduce-bench` showed a rank's error without one)."""
    env = {k: v for k, v in os.environ.items() if k != "MLDEBUG_DEBUG"}
    said = [mldebug(*args, "exec", "--local", "--", "sh", "-c", "echo debug=${MLDEBUG_DEBUG:-}", env=env).stdout
            for args in ([], ["--debug"])]
    assert "debug=\n" in said[0] and "debug=1\n" in said[1], said


def test_global_json_and_mldebug_json_give_the_same_document() -> None:
    flag = mldebug("--json", "env", "--no-torch")
    env_var = mldebug("env", "--no-torch", env={"MLDEBUG_JSON": "1"})
    off = mldebug("env", "--no-torch", env={"MLDEBUG_JSON": "0"})
    for proc in (flag, env_var, off):
        assert proc.returncode == 0, proc.stderr
    a, b = _doc(flag, "env"), _doc(env_var, "env")
    assert a["schema"] == b["schema"] == "mldebug.env"
    assert a["result"]["summary"] == b["result"]["summary"]
    assert not off.stdout.lstrip().startswith("{") and a["result"]["summary"] in off.stdout  # human again


def test_mldebug_debug_adds_the_traceback_to_the_one_line_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-hosts")
    plain = mldebug("exec", "--hosts", missing, "--", "true")
    debug = mldebug("exec", "--hosts", missing, "--", "true", env={"MLDEBUG_DEBUG": "1"})
    assert plain.returncode == debug.returncode == 2
    assert "Traceback" not in plain.stderr
    assert "Traceback (most recent call last)" in debug.stderr and "UsageError" in debug.stderr
    assert f"mldebug: error: hostfile '{missing}' does not exist" in debug.stderr  # still the one line
    assert debug.stderr.rstrip().splitlines()[-1].startswith("hint: ")


# ------------------------------------------------------------------------------ allreduce-bench


def test_allreduce_bench_init_timeout_with_a_rank_that_never_answers_is_4() -> None:
    # rank 0 of 2, started by hand (as torchrun would); rank 1 never comes
    with reserved_port() as port:
        env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        proc = mldebug("allreduce-bench", "--collective-timeout", "3", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "--json",
                       env=env, timeout=120)
    assert proc.returncode == 4, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-2].startswith("mldebug: error: ") and "timed out after 3 s" in lines[-2], lines
    assert "1/2 clients joined" in lines[-2] and lines[-1].startswith("hint: some rank never joined")


# ------------------------------------------------------------------------------ core-bt


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real core of a Python process that segfaulted in C."""
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    require(not pattern.startswith(("|", "/")), f"core_pattern writing into the crashing cwd (it is {pattern!r})")
    d = tmp_path_factory.mktemp("crash")

    def unlimited() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    proc = subprocess.run([sys.executable, "-c", CRASH], cwd=d, preexec_fn=unlimited, capture_output=True, timeout=60)
    assert proc.returncode == -11
    cores = [p for p in d.iterdir() if p.name.startswith("core")]
    require(cores, f"a core file in {d} (core_pattern {pattern!r}, ulimit -c)")
    return cores[0]


def test_core_bt_without_gdb_or_pystack_is_3(crashed: Path, tmp_path: Path) -> None:
    python, env = _bare_python(tmp_path)
    proc = subprocess.run([python, "-m", "ml_debug", "core-bt", str(crashed)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 3, proc.stderr
    assert "mldebug: error: missing gdb: core-bt" in proc.stderr and "hint: " in proc.stderr and "pystack" in proc.stderr


def test_core_bt_with_an_unreadable_core_is_4_and_shows_the_rest(crashed: Path, tmp_path: Path) -> None:
    require(subprocess.run(["gdb", "--version"], capture_output=True).returncode == 0, "gdb")
    cut = tmp_path / "core.cut"
    cut.write_bytes(crashed.read_bytes()[:8192])  # an ELF core header, and nothing gdb can use
    proc = mldebug("core-bt", "--json", str(crashed), str(cut), timeout=240)
    assert proc.returncode == 4, proc.stderr
    result = _doc(proc, "core-bt")["result"]
    by_path = {c["path"]: c for c in result["cores"]}
    assert by_path[str(crashed)]["ok"] and "crash_here (<string>:3)" in by_path[str(crashed)]["python_frames"]
    assert not by_path[str(cut)]["ok"] and by_path[str(cut)]["error"]


# ------------------------------------------------------------------------------ exec


def test_exec_slurm_job_without_slurm_tools_is_3(tmp_path: Path) -> None:
    python, env = _bare_python(tmp_path)
    proc = subprocess.run([python, "-m", "ml_debug", "exec", "--slurm-job", "1", "--", "true"], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith("mldebug: error: squeue is not installed here") and "\nhint: " in proc.stderr


# ------------------------------------------------------------------------------ health


def test_health_out_dir_holds_the_document(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = mldebug("health", "--json", "--path", str(tmp_path), "--out-dir", str(out), timeout=120)
    doc = _doc(proc, "health")
    assert proc.returncode == doc["result"]["exit_code"]
    assert json.loads((out / "health.json").read_text())["result"] == doc["result"]


@pytest.mark.rig
def test_health_with_a_node_that_never_answers_is_4_unless_a_check_failed(rig_ssh, tmp_path: Path) -> None:
    node = rig_ssh.nodes[0]
    out = tmp_path / "out"
    # nobody listens there: refused at once (the real node's limit is wide: its ssh handshake on two busy cores
    # once took over 3 s, and it was reported unreachable too)
    with closed_port() as dead:
        hostfile = tmp_path / "hosts"
        hostfile.write_text(f"{node.name}\n127.0.0.1:{dead}\n")
        proc = mldebug("health", "--hosts", str(hostfile), "--ssh-config", str(rig_ssh.ssh_config),
                       "--remote-python", VENV_PYTHON, "--connect-timeout", "20", "--path", "/tmp", "--json",
                       "--out-dir", str(out), timeout=240)
    result = _doc(proc, "health")["result"]
    assert [u["host"] for u in result["unreachable"]] == [f"127.0.0.1:{dead}"]
    assert [n["target"] for n in result["nodes"]] == [node.name]
    failed = any(c["status"] == "fail" for n in result["nodes"] for c in n["checks"])
    assert proc.returncode == result["exit_code"] == (1 if failed else 4), result["summary"]
    # --out-dir: each node's answer as it arrived, the unreachable one with its reason
    answered = json.loads((out / f"{node.name}.json").read_text())
    assert answered["exit_code"] == result["nodes"][0]["exit_code"] and '"mldebug.health"' in answered["stdout"]
    refused = json.loads((out / f"127.0.0.1:{dead}.json").read_text())
    assert refused["failure"] == "unreachable" and refused["exit_code"] is None


# ------------------------------------------------------------------------------ dump-stacks


def test_dump_stacks_with_every_rank_in_the_same_place_is_0(hung_job) -> None:  # type: ignore[no-untyped-def]
    job = hung_job(nranks=2, odd_rank=-1)  # both ranks wait in recv: nobody is the odd one out
    proc = mldebug("dump-stacks", "--pid", str(job.launcher_pids[0]), "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = _doc(proc, "dump-stacks")["result"]
    assert result["suspects"] == [] and result["ok"] is True
    assert result["verdict"].startswith("no suspect: all 2 ranks wait in recv (distributed_c10d.py:"), result["verdict"]
    assert sorted(p["rank"] for p in result["processes"]) == [0, 1]


# ------------------------------------------------------------------------------ check

MARK = "MLDEBUG_EXIT_CODES_TEST_MARK"  # every process a check started inherits it
CHECK_GPU_TEST_ONLY = ["check", "--json", "--skip", "env", "--skip", "health", "--skip", "allreduce-bench"]


def test_check_a_step_that_times_out_is_4_and_its_ranks_are_stopped() -> None:
    # rank 1 stalls for good at broadcast (its stage watchdog would end it after 30 s): the step is
    # surely still running at its 5 s limit, however fast this machine starts the ranks; the step is
    # stopped there with every process it started
    mark = uuid.uuid4().hex
    t0 = time.monotonic()
    proc = mldebug(*CHECK_GPU_TEST_ONLY, "--step-timeout", "5",
                   env={**faults.env("gpu-test.hang:rank=1,stage=broadcast"), MARK: mark}, timeout=400)
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert time.monotonic() - t0 < 30
    result = _doc(proc, "check")["result"]
    (step,) = [s for s in result["steps"] if s["name"] == "gpu-test"]
    assert step["status"] == "timeout" and step["exit_code"] is None
    assert not result["ok"]
    # SIGKILLed processes vanish once reaped: give that a moment, never a hang
    wait_until(lambda: not pids_with_env(MARK, mark), 10, "every process of the timed-out step to be gone")


# ------------------------------------------------------------------------------ a shared --out-dir


def test_a_second_run_into_an_out_dir_in_use_is_refused_and_the_first_keeps_its_files(tmp_path: Path) -> None:
    """Two runs given one --out-dir at once mixed their files silently (exec's node files, gpu-test's rank
    files appended by both). The run that holds it keeps it; exec, a self-launched gpu-test and rank 0 of
    a gpu-test under a launcher are refused with exit 2 before they write; a run after it ends may reuse it."""
    out, go = tmp_path / "shared", tmp_path / "go"
    env = {**os.environ, "MLDEBUG_WIDTH": "160", "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([sys.executable, "-m", "ml_debug", "exec", "--local", "--out-dir", str(out), "--",
                              sys.executable, "-c", f"import os, time\nwhile not os.path.exists({str(go)!r}): "
                              "time.sleep(0.05)\nprint('first run')"], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: out.is_dir(), 60, "the first run to make its --out-dir")
        refused = "is in use by another mldebug run: the two runs would mix their files"
        second = mldebug("exec", "--local", "--out-dir", str(out), "--", "echo", "second run", timeout=60)
        gpu = mldebug("gpu-test", "--out-dir", str(out), "--backend", "gloo", timeout=60)
        rank0 = mldebug("gpu-test", "--out-dir", str(out), "--backend", "gloo", timeout=60,
                        env={"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"})
        for proc in (second, gpu, rank0):
            assert proc.returncode == 2 and refused in proc.stderr, proc.stderr[-1500:]
            assert "Traceback" not in proc.stderr
        assert sorted(p.name for p in out.iterdir()) == []  # nothing of theirs, and the first has not answered
    finally:
        go.touch()
        so, se = first.communicate(timeout=60)
    assert first.returncode == 0 and "first run" in so, se
    [name] = [p.name for p in out.iterdir() if p.suffix == ".out"]
    assert "first run" in (out / name).read_text()
    again = mldebug("exec", "--local", "--out-dir", str(out), "--", "echo", "third run", timeout=60)
    assert again.returncode == 0 and "third run" in (out / name).read_text(), again.stderr
