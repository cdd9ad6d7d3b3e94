"""`mldebug exec --slurm-job` and the srun transport on the rig's real Slurm cluster (slurmd in the
network-namespace nodes, fake GRES gpu)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import jsonschema
import pytest

from ml_debug.remote.options import resolve_targets
from ml_debug.remote.runner import run_mldebug_everywhere
from ml_debug.remote.slurm import srun_argv
from tests.conftest import REPO, kill_pids, mldebug, wait_until
from tests.rig.fixtures import SlurmRig

pytestmark = pytest.mark.rig

VENV_PYTHON = str(REPO / ".venv" / "bin" / "python")
SCHEMA = json.loads((REPO / "ml_debug" / "schemas" / "exec.json").read_text())


@pytest.fixture(scope="module")
def running_job(rig_slurm: SlurmRig) -> Iterator[str]:
    """A job on every rig node whose step holds one (fake) GPU per node."""
    extra = ["--gres=gpu:1"] if rig_slurm.gpus_per_node else []
    job = rig_slurm.sbatch(["sleep", "600"], nodes=len(rig_slurm.nodes), extra=extra)
    try:
        rig_slurm.wait_running(job, timeout=60)
        yield job
    finally:
        rig_slurm.cancel(job)


def _exec(rig: SlurmRig, *args: str):
    return mldebug("exec", *args, env={"SLURM_CONF": str(rig.conf)}, timeout=120)


def test_exec_reaches_every_node_of_a_running_job(rig_slurm: SlurmRig, running_job: str) -> None:
    proc = _exec(rig_slurm, "--json", "--slurm-job", running_job, "--", "sh", "-c",
                 'echo "$(hostname) $0"; echo "err $(hostname)" >&2; [ "$(hostname)" = node2 ] && exit 3; true',
                 "a;b $(x)")
    assert proc.returncode == 1, proc.stderr  # node2's command failed, every node answered
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, SCHEMA)
    result = doc["result"]
    assert result["transport"] == "slurm" and result["slurm_job"] == running_job
    nodes = {n["host"]: n for n in result["nodes"]}
    assert sorted(nodes) == sorted(rig_slurm.nodes)
    for name, n in nodes.items():
        assert n["stdout"] == f"{name} a;b $(x)\n"  # each node's own hostname, arguments literal
        assert n["stderr"] == f"err {name}\n"
        assert n["exit_code"] == (3 if name == "node2" else 0)
    assert nodes["node2"]["failure"] == "command failed"


def test_prefixed_output_over_slurm(rig_slurm: SlurmRig, running_job: str) -> None:
    proc = _exec(rig_slurm, "--slurm-job", running_job, "--", "hostname")
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == [f"[{n}] {n}" for n in sorted(rig_slurm.nodes)]


def test_a_hanging_node_times_out_and_the_others_report(rig_slurm: SlurmRig, running_job: str) -> None:
    proc = _exec(rig_slurm, "--json", "--slurm-job", running_job, "--node-timeout", "3", "--", "sh", "-c",
                 '[ "$(hostname)" = node1 ] && exec sleep 120; echo ok')
    assert proc.returncode == 4, proc.stderr
    nodes = {n["host"]: n for n in json.loads(proc.stdout)["result"]["nodes"]}
    assert nodes["node1"]["failure"] == "timed out" and nodes["node1"]["duration_s"] < 20
    for name in rig_slurm.nodes[1:]:
        assert nodes[name]["failure"] is None and nodes[name]["stdout"] == "ok\n"
    # The step was cancelled: nothing of it is left running on node1.
    steps = rig_slurm.run(["squeue", "-h", "-s", "-j", running_job, "-o", "%i %j"]).stdout
    assert "sleep 120" not in steps and "sh" not in steps.split()


def test_gres_jobs_get_a_gpu_free_step(rig_slurm: SlurmRig, running_job: str, monkeypatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(rig_slurm.conf))
    spec = resolve_targets(slurm_job=running_job)
    assert [t.host for t in spec.targets] == rig_slurm.nodes
    assert spec.slurm_gres_gpu == bool(rig_slurm.gpus_per_node)
    argv = srun_argv(running_job, rig_slurm.nodes, "true", spec.slurm_gres_gpu)
    # --mem=0: the step takes none of the job's memory (the rig allocates memory: CR_CPU_Memory)
    assert argv[:5] == ["srun", f"--jobid={running_job}", "--overlap", "--mem=0", f"--nodes={len(rig_slurm.nodes)}"]
    assert ("--gres=gpu:0" in argv) == spec.slurm_gres_gpu


def test_agent_pattern_inside_the_job(rig_slurm: SlurmRig, running_job: str, monkeypatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(rig_slurm.conf))
    spec = resolve_targets(slurm_job=running_job, remote_python=str(Path(REPO) / ".venv" / "bin" / "python"))
    results = run_mldebug_everywhere(spec, ["env", "--no-torch"], timeout_s=90, add_local=False)
    assert [r.node.host for r in results] == rig_slurm.nodes
    for r in results:
        assert r.error is None, r
        assert r.document["schema"] == "mldebug.env" and r.document["result"]["host"] == r.node.host


def test_unknown_and_pending_jobs_are_exit_2(rig_slurm: SlurmRig) -> None:
    proc = _exec(rig_slurm, "--slurm-job", "987654", "--", "true")
    assert proc.returncode == 2
    assert "slurm job 987654 not found: slurm_load_jobs error: Invalid job id specified" in proc.stderr
    pending = rig_slurm.sbatch(["true"], nodes=1, extra=["--begin=now+1hour"])
    try:
        proc = _exec(rig_slurm, "--slurm-job", pending, "--", "true")
        assert proc.returncode == 2
        assert f"slurm job {pending} is PENDING, not RUNNING" in proc.stderr
    finally:
        rig_slurm.cancel(pending)


# -- nothing outlives a SIGKILLed mldebug: srun is tied to it and cancels its step -----------------------------
# one process that holds the word in its own argv (a `sh -c 'sleep'` would leave a sleep without it, whose
# open stdout keeps the step COMPLETING should a test have to clean up by hand)
SLEEPER = "import time; time.sleep(600)"

def _with_word(word: str) -> list[int]:
    """Processes here and on the nodes (root sees theirs in /proc) whose command line holds `word`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if word.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _steps(rig: SlurmRig, job: str) -> set[str]:
    return set(rig.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"]).stdout.split())


def _sigkill_leaves_nothing(rig: SlurmRig, job: str, proc: subprocess.Popen[bytes], word: str, before: set[str],
                            started: Callable[[], bool]) -> None:
    try:
        wait_until(lambda: started() or proc.poll() is not None, 120, "mldebug's step to run on the job's nodes")
        assert proc.poll() is None, f"mldebug ended (rc {proc.returncode}) before its step ran"
        assert [p for p in _with_word(word) if b"srun" in Path(f"/proc/{p}/cmdline").read_bytes()[:64]]
        proc.kill()
        proc.wait(timeout=30)
        # srun got SIGTERM from the kernel, cancelled its step and ended: nothing of it is left anywhere
        wait_until(lambda: not _with_word(word) and _steps(rig, job) == before, 30,
                   f"srun, its step and the command to end (left: {_with_word(word)}, steps {_steps(rig, job)})")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_pids(_with_word(word))


def test_a_sigkilled_exec_leaves_no_srun_step_or_command(rig_slurm: SlurmRig, running_job: str) -> None:
    """SIGKILL of `mldebug exec --slurm-job J` left srun running with parent 1, and its step and the command
    on every node (over ssh nothing is left: the sessions close)."""
    word = f"mldebug-test-{uuid.uuid4().hex[:12]}"
    before = _steps(rig_slurm, running_job)
    proc = subprocess.Popen([sys.executable, "-m", "ml_debug", "exec", "--slurm-job", running_job, "--node-timeout", "600",
                             "--", sys.executable, "-c", SLEEPER, word], env=rig_slurm.env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def on_every_node() -> bool:  # the command itself, not only srun: the sleeper (WORD in its argv) on each node
        return len([p for p in _with_word(word) if SLEEPER.encode() in Path(f"/proc/{p}/cmdline").read_bytes()
                    and b"srun" not in Path(f"/proc/{p}/cmdline").read_bytes()
                    and b"bash" not in Path(f"/proc/{p}/cmdline").read_bytes()[:40]]) >= len(rig_slurm.nodes)

    _sigkill_leaves_nothing(rig_slurm, running_job, proc, word, before, on_every_node)


def test_a_sigkilled_top_leaves_no_stream_step(rig_slurm: SlurmRig, running_job: str, tmp_path: Path) -> None:
    """top's streams start srun from a thread that returns once the stream is connected; the tie follows the
    thread that forked (prctl(2)), so they are started by one that lives as long as mldebug: the streams
    answer (a document with every node), and a SIGKILL of top still ends every srun and its step."""
    word = f"mldebug-test-{uuid.uuid4().hex[:12]}"
    before = _steps(rig_slurm, running_job)
    out = tmp_path / "top.jsonl"
    with open(out, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "ml_debug", "top", "--slurm-job", running_job, "--json",
                                 "--count", "1000", "--interval", "1", "--remote-python", VENV_PYTHON,
                                 "--remote-prefix", f"export MLDEBUG_TEST_WORD={word}"],
                                env=rig_slurm.env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.DEVNULL,
                                start_new_session=True)

    def every_node_answers() -> bool:
        for line in out.read_text().splitlines()[::-1]:
            nodes = json.loads(line)["result"].get("nodes", [])
            return sorted(n["host"] for n in nodes if not n.get("error")) == sorted(rig_slurm.nodes)
        return False

    _sigkill_leaves_nothing(rig_slurm, running_job, proc, word, before, every_node_answers)
