"""`mldebug watch` on real jobs: self-launched `mldebug train` ranks with injected faults (gloo, real py-spy),
the same hang spread over two rig nodes under Slurm and over ssh, a desync seen through the Flight
Recorder, a healthy job, Ctrl-C (a straggler: the straggler drill's evidence, tests/cli/test_drill.py). Every process a test starts carries MLDEBUG_TEST_JOB=<token> in
its environment (ranks inherit it), which is how leftovers are found."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from html import escape
from pathlib import Path

import pytest

from tests.conftest import REPO, kill_pids, pids_with_env, py_spy, require, validate_schema, wait_until
from tests.fakes import pythonpath
from tests.rig.fixtures import rig_port

TOKEN_VAR = "MLDEBUG_TEST_JOB"
FAST = ["--stall", "10", "--grace", "0", "--interval", "1", "--stack-every", "2"]


@dataclass
class Job:
    proc: subprocess.Popen[bytes]
    token: str
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def said(self, text: str) -> bool:
        assert self.proc.poll() is None, f"the job ended early:\n{self.log.read_text(errors='replace')[-3000:]}"
        return text in self.log.read_text(errors="replace")


def _env(token: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", TOKEN_VAR: token, "MLDEBUG_WIDTH": "160", **(extra or {})}
    env["PYTHONPATH"] = pythonpath(env)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "MLDEBUG_FR_DIR"):
        if var not in (extra or {}):
            env.pop(var, None)
    return env


@pytest.fixture
def train(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    """Start `mldebug train --nproc-per-node 2 ARGS` (self-launched, 300 s collective timeout); teardown
    kills every process of the job by pid and fails if one survives."""
    jobs: list[Job] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Job:
        token = uuid.uuid4().hex[:12]
        log = tmp_path / f"train-{token}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "ml_debug", "train", "--nproc-per-node", "2", "--collective-timeout",
                                     "300", *args], env=_env(token, env), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, cwd=tmp_path)
        job = Job(proc, token, log)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        kill_pids([job.pid, *pids_with_env(TOKEN_VAR, job.token)])
        job.proc.wait(timeout=30)
        wait_until(lambda job=job: not pids_with_env(TOKEN_VAR, job.token), 30, f"job {job.token} to be gone")


def watch(*args: str, timeout: float = 240, env: dict[str, str] | None = None,
          token: str | None = None) -> subprocess.CompletedProcess[str]:
    """`mldebug --json watch ARGS`; afterwards nothing it started is left."""
    token = token or uuid.uuid4().hex[:12]
    proc = subprocess.run([sys.executable, "-m", "ml_debug", "--json", "watch", *args], capture_output=True,
                          text=True, timeout=timeout, env=_env(token, env), stdin=subprocess.DEVNULL)
    wait_until(lambda: not pids_with_env(TOKEN_VAR, token), 30, "every process of the watch to be gone")
    return proc


def result_of(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.stdout.strip(), f"no JSON on stdout; stderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(proc.stdout)
    validate_schema(doc, "watch")
    return doc["result"]


def bundle_summary(out: Path) -> dict:
    doc = json.loads((out / "summary.json").read_text())
    validate_schema(doc, "watch")
    return doc["result"]


def _tools() -> None:
    require(py_spy(), "py-spy")


def test_a_hung_rank_is_named_in_a_bundle_within_stall_plus_20_s_and_ctrl_c_keeps_the_bundle(
        train: Callable[..., Job], tmp_path: Path) -> None:
    """Then Ctrl-C stops the hung job itself cleanly (exit 130)."""
    _tools()
    job = train("--steps", "1000", "--inject", "hang@step=3,rank=1")
    out, marker = tmp_path / "bundle", tmp_path / "on-incident"
    hook = f"{sys.executable} -c 'import os, sys; open(sys.argv[1], \"w\").write(os.environ[\"MLDEBUG_INCIDENT\"])' " \
           f"{marker}"
    token = uuid.uuid4().hex[:12]
    w = subprocess.Popen([sys.executable, "-m", "ml_debug", "--json", "watch", "--pid", str(job.pid), *FAST,
                          "--bundle-dir", str(out), "--on-incident", hook], env=_env(token), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        def watching() -> bool:
            assert w.poll() is None, f"watch exited {w.returncode}: {w.communicate()[1][-3000:]}"
            return True

        wait_until(lambda: watching() and job.said("injected hang at step 3"), 180, "rank 1 to reach its hang")
        wait_until(lambda: (out / "summary.json").exists() or not watching(), 10 + 20,
                   "the bundle within stall + 20 s of the hang")
        stdout, stderr = w.communicate(timeout=180)
    finally:
        if w.poll() is None:
            w.kill()
    assert w.returncode == 1, stderr[-3000:]
    proc = subprocess.CompletedProcess(w.args, w.returncode, stdout, stderr)
    result = result_of(proc)
    summary = bundle_summary(out)
    for r in (result, summary):
        assert r["status"] == "complete" and r["incident"]["kind"] == "stall", r["summary"]
        assert r["culprit"]["rank"] == 1 and r["culprit"]["where"].startswith("injected_hang"), r["culprit"]
        assert r["summary"].startswith("rank 1 (") and "stuck in injected_hang (faults.py:" in r["summary"]
        assert "no progress since" in r["summary"]
    assert summary["next"][0] == f"mldebug dump-stacks --pid {summary['culprit']['pid']} --native"
    assert {p["name"]: p["status"] for p in summary["parts"]} == {
        "dump-stacks": "ok", "health": "ok", "progress": "skipped", "env": "ok"}
    assert {"summary.md", "summary.json", "watch.json", "dump-stacks.json", "dump-stacks.txt", "env.json"} <= \
        {p.name for p in out.iterdir()}
    assert (out / "summary.md").read_text().splitlines()[2] == f"**{summary['summary']}**"
    # below Python, in the bundle too: the hung rank sleeps in the kernel (issue: the kernel's view in watch)
    stacks = json.loads((out / "dump-stacks.json").read_text())["result"]
    kernel = {p["rank"]: p["kernel"]["verdict"] for p in stacks["processes"]}
    assert kernel[1].startswith("blocked in clock_nanosleep()"), kernel
    assert "below Python (what the kernel says" in (out / "dump-stacks.txt").read_text()
    assert marker.read_text() == str(out.resolve())
    assert summary["on_incident"]["exit_code"] == 0
    assert not pids_with_env(TOKEN_VAR, token)

    # Ctrl-C while a bundle is being collected, after 2 of 8 stack samples: exit 130, what was written
    # says it was cut short, and the samples taken are in it (they were lost with dump-stacks' thread)
    out2, err2 = tmp_path / "cut", tmp_path / "cut.err"
    token2 = uuid.uuid4().hex[:12]
    with open(err2, "w") as err_file:
        w2 = subprocess.Popen([sys.executable, "-m", "ml_debug", "--json", "watch", "--pid", str(job.pid), "--now",
                               "--samples", "8", "--bundle-dir", str(out2)], env=_env(token2), stdout=subprocess.PIPE,
                              stderr=err_file, text=True, stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: "sample 2/8 taken" in err2.read_text() and w2.poll() is None, 120,
                   "two stack samples of the bundle")
        w2.send_signal(signal.SIGINT)
        time.sleep(0.01)  # a second SIGINT 10 ms later, as `timeout -s INT` sends to the group: not a sync
        w2.send_signal(signal.SIGINT)
        stdout, _ = w2.communicate(timeout=60)
    finally:
        if w2.poll() is None:
            w2.kill()
    stderr = err2.read_text()
    assert w2.returncode == 130, stderr[-3000:]
    cut = bundle_summary(out2)
    assert cut["status"] == "interrupted" and cut["incident"]["kind"] == "requested"
    assert json.loads(stdout)["result"]["status"] == "interrupted"
    parts = {p["name"]: p for p in cut["parts"]}
    assert parts["dump-stacks"]["status"] == "interrupted" and "dump-stacks.json" in parts["dump-stacks"]["files"]
    stacks = json.loads((out2 / "dump-stacks.json").read_text())["result"]
    assert stacks["interrupted"] is True
    assert {len(p["samples"]) for p in stacks["processes"]} in ({2}, {3}), stacks["summary"]
    assert cut["culprit"]["rank"] == 1, cut["summary"]
    # the page of a cut bundle: its sentence, and the samples taken
    page = (out2 / "incident.html").read_text()
    assert f'id="verdict">{escape(cut["summary"])}</div>' in page and 'class="leaf suspect"' in page
    wait_until(lambda: not pids_with_env(TOKEN_VAR, token2), 30, "the interrupted watch's processes to be gone")

    # Ctrl-C in the hung job's terminal (its process group): `mldebug train` exits 130 without a traceback
    # or the launcher's log, and no rank outlives it (tests/rig/test_interrupt.py does the other commands)
    os.killpg(job.pid, signal.SIGINT)
    assert job.proc.wait(timeout=90) == 130, job.log.read_text(errors="replace")[-3000:]
    log = job.log.read_text(errors="replace")
    assert "mldebug: error: interrupted" in log and "Traceback" not in log, log[-3000:]
    assert "torch/distributed/elastic" not in log, log[-3000:]
    wait_until(lambda: not pids_with_env(TOKEN_VAR, job.token), 20, "the interrupted job's processes to be gone")


@pytest.mark.serial
def test_a_healthy_job_gives_no_incident(train: Callable[..., Job], tmp_path: Path) -> None:
    _tools()
    metrics, out = tmp_path / "metrics", tmp_path / "bundle"
    job = train("--steps", "100000", "--metrics-dir", str(metrics))
    proc = watch("--pid", str(job.pid), "--progress-file", str(metrics / "rank-{rank}.jsonl"), "--stall", "10",
                 "--grace", "0", "--interval", "1", "--stack-every", "1", "--duration", "15", "--bundle-dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_of(proc)
    assert result["summary"].startswith("no incident: 2 rank(s) on 1 node(s) made progress during")
    assert result["incident"] is None and result["bundle"] is None and not out.exists()
    assert {r["status"] for r in result["ranks"]} == {"ok"} and result["stack_rounds"] >= 8
    assert all(r["progress_file"]["step"] > 1 for r in result["ranks"])


def test_a_desync_is_named_by_the_flight_recorder_in_the_bundle(
        train: Callable[..., Job], tmp_path: Path) -> None:
    """(dump-stacks alone on such a job, with the Flight Recorder: the desync drill, tests/cli/test_drill.py)"""
    _tools()
    fr_dir, out = tmp_path / "fr", tmp_path / "bundle"
    job = train("--steps", "1000", "--inject", "desync@step=3,rank=1",
                env={"TORCH_FR_BUFFER_SIZE": "2000", "MLDEBUG_FR_DIR": str(fr_dir)})
    proc = watch("--pid", str(job.pid), *FAST, "--bundle-dir", str(out))
    assert proc.returncode == 1, proc.stderr[-3000:]
    summary = bundle_summary(out)
    assert summary["culprit"]["rank"] == 1 and summary["culprit"]["why"] == "desync", summary["culprit"]
    assert summary["culprit"]["op"] == "gloo:all_reduce"
    assert summary["summary"].startswith("rank 1 (") and "issued a different collective than rank 0 (desync" in \
        summary["summary"] and "gloo:all_reduce [[7]]" in summary["summary"]
    fr = json.loads((out / "flight-recorder.json").read_text())
    assert fr["analysis"]["culprits"][0]["rank"] == 1
    assert "desync in collective #" in (out / "dump-stacks.txt").read_text()
    # the bundle's page shows it too: the odd rank's cell in the Flight Recorder grid (in a browser: test_page.py)
    page = (out / "incident.html").read_text()
    assert "Flight Recorder: where each rank stopped" in page and page.count('class="c desync"') == 1


@pytest.mark.serial
def test_a_busy_rank_whose_gpu_spins_at_low_power_stalls(tmp_path: Path) -> None:
    """A rank at 100 % CPU would count as progressing; its GPU (NVML, here the fake: no GPU on this
    machine) busy at 15 % of its power limit is a NCCL kernel spinning, so it does not."""
    from tests.fakes import nvml as fake_nvml

    token = uuid.uuid4().hex[:12]
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"], env=_env(token, {"RANK": "0"}),
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        gpu = fake_nvml.healthy_gpu(0) | {"utilization": 100, "power_mw": 105000, "processes": [[spin.pid, 1 << 30]]}
        scenario = tmp_path / "nvml.json"
        scenario.write_text(json.dumps({"gpus": [gpu]}))
        proc = watch("--pid", str(spin.pid), "--stall", "4", "--grace", "0", "--interval", "1", "--stack-every", "0",
                     "--duration", "20", "--bundle-dir", str(tmp_path / "bundle"), env=fake_nvml.env(scenario))
    finally:
        spin.kill()
        spin.wait(timeout=30)
    assert proc.returncode == 1, proc.stderr[-3000:]
    result = result_of(proc)
    (rank,) = result["incident"]["ranks"]
    assert rank["cpu_pct"] > 50 and rank["gpu"][0]["util_pct"] == 100 and rank["gpu"][0]["power_pct"] == 15
    assert "GPU 0 100% busy at 15% of its power limit (a kernel spinning while it waits for a peer)" in rank["signs"]


# ------------------------------------------------------------------------------- the rig: Slurm and ssh


def test_same_hang_over_two_rig_nodes_watched_by_the_slurm_template_and_over_ssh(rig_slurm, rig_ssh,
                                                                                 tmp_path: Path) -> None:
    """slurm/watch.sbatch trains on two rig nodes with `mldebug watch --slurm-job` beside the job (rank 1
    hangs on the second node); then, the job kept running, `watch --hosts` reaches the same ranks over ssh
    while a third host never answers."""
    _tools()
    token = uuid.uuid4().hex[:12]
    out, log = tmp_path / "slurm-bundle", tmp_path / "job.out"
    nodes = rig_slurm.nodes[:2]
    env = _env(token, {**rig_slurm.env, "SLURM_CONF": str(rig_slurm.conf), "GLOO_SOCKET_IFNAME": "eth0",
                       "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                       "MASTER_ADDR": rig_slurm.node_ips[nodes[0]], "MASTER_PORT": str(rig_port()),
                       "MLDEBUG_TRAIN": f"{sys.executable} -m ml_debug train --steps 1000 --collective-timeout 300 "
                                        "--inject hang@step=3,rank=1",
                       "MLDEBUG_ARGS": " ".join(FAST), "MLDEBUG_OUT": str(out), "MLDEBUG_KEEP_JOB": "1",
                       "MLDEBUG_RUN_DIR": str(tmp_path / "run")})
    sub = subprocess.run(["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=2",
                          "--cpus-per-task=1", "--time=00:10:00", "-w", ",".join(nodes), "-o", str(log),
                          f"--chdir={tmp_path}", "-J", f"watch-{token}", str(REPO / "slurm" / "watch.sbatch")],
                         capture_output=True, text=True, timeout=60, env=env)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    try:
        def bundle_done() -> bool:
            assert rig_slurm.run(["squeue", "-h", "-j", job, "-o", "%i"]).stdout.strip(), \
                f"the job ended early:\n{log.read_text(errors='replace')[-3000:] if log.exists() else ''}"
            return (out / "summary.json").exists() and bundle_summary(out)["status"] == "complete"

        wait_until(bundle_done, 240, "the template's watcher to write a complete bundle")
        wait_until(lambda: "mldebug watch: exit 1; bundle:" in log.read_text(errors="replace"), 60,
                   "the template to say where the bundle is")
        ssh_nodes = [n for n in rig_ssh.nodes if n.name in nodes]
        bad = rig_ssh.bad_hostkey_host  # a node that never answers: reported, not waited for
        via_ssh = watch("--hosts", str(rig_ssh.hostfile([*ssh_nodes, bad])), "--ssh-config", str(rig_ssh.ssh_config),
                        "--env", f"SLURM_JOB_ID={job}", "--connect-timeout", "5", "--node-timeout", "3",
                        "--remote-python", sys.executable, *FAST, "--bundle-dir", str(tmp_path / "ssh"))
        assert via_ssh.returncode == 1, via_ssh.stderr[-3000:]
    finally:
        rig_slurm.cancel(job)
    slurm_r, ssh_r = bundle_summary(out), result_of(via_ssh)
    for r in (slurm_r, ssh_r):
        assert r["status"] == "complete" and r["incident"]["kind"] == "stall", r["summary"]
        assert (r["culprit"]["rank"], r["culprit"]["host"]) == (1, nodes[1]), r["culprit"]
        assert r["summary"].startswith(f"rank 1 ({nodes[1]}, pid ") and "stuck in injected_hang" in r["summary"]
        assert sorted((x["rank"], x["host"]) for x in r["ranks"]) == [(0, nodes[0]), (1, nodes[1])]
    assert slurm_r["next"] == [f"mldebug dump-stacks --slurm-job {job} --native"]
    silent = [n for n in ssh_r["nodes"] if not n["answering"]]
    assert [n["label"] for n in silent] == [bad.name] and "host key" in (silent[0]["error"] or ""), ssh_r["nodes"]
    assert ssh_r["next"] == [f"mldebug dump-stacks --hosts {ssh_nodes[1].name} --native"]
    # nothing left: no rank, no sampling agent (srun steps and ssh sessions end with the watchers)
    wait_until(lambda: not pids_with_env(TOKEN_VAR, token), 60, "every process of the job to be gone")
    wait_until(lambda: not [p for p in _cmdlines() if "top --agent" in p and f"SLURM_JOB_ID={job}" in p], 30,
               "every sampling agent to be gone")


def _cmdlines() -> list[str]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                out.append(Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
    return out


def test_watch_help_is_documented() -> None:
    page = REPO / "docs" / "commands" / "watch.md"
    text = page.read_text()
    for flag in ("--stall", "--grace", "--progress-file", "--now", "--keep-watching", "--on-incident", "--bundle-dir",
                 "--stack-every", "--straggler-factor", "--node-timeout", "--duration"):
        assert f"`{flag}" in text, flag


def test_on_incident_dies_with_a_sigkilled_watch(tmp_path: Path) -> None:
    """`watch --on-incident CMD` killed with SIGKILL left CMD running with parent 1: it is tied to watch
    (PR_SET_PDEATHSIG, ml_debug/core/bounded.py) and gets SIGTERM. The target is any process (`--now`)."""
    token = uuid.uuid4().hex[:12]
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=_env(f"target-{token}"),
                              stdin=subprocess.DEVNULL)
    started = tmp_path / "cmd-started"
    cmd = f"{sys.executable} -c 'import os, sys, time; open(sys.argv[1], \"w\").write(str(os.getpid())); " \
          f"time.sleep(600)' {started}"
    w = subprocess.Popen([sys.executable, "-m", "ml_debug", "watch", "--pid", str(target.pid), "--now", "--samples",
                          "1", "--bundle-dir", str(tmp_path / "bundle"), "--on-incident", cmd], env=_env(token),
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: started.exists() and started.read_text() or w.poll() is not None, 120,
                   "the --on-incident command to start")
        assert w.poll() is None, w.communicate()[1][-3000:]
        cmd_pid = int(started.read_text())
        assert cmd_pid in pids_with_env(TOKEN_VAR, token)
        w.kill()
        w.wait(timeout=30)
        wait_until(lambda: cmd_pid not in pids_with_env(TOKEN_VAR, token), 30,
                   "the --on-incident command to end with watch")
    finally:
        kill_pids([w.pid, *pids_with_env(TOKEN_VAR, token)])
        target.kill()
        target.wait(timeout=30)
