"""`mldebug logs --slurm-job J` on the rig's real Slurm (slurmdbd and MariaDB for accounting): jobs that fail
in the ways a post-mortem must tell apart, submitted as one batch and read after they ended, from another
directory, with only their ids.

- a 2-node job whose rank 1 raises: the rank, its node, the exception and the step's FAILED state;
- a job whose task goes over its --mem: OUT_OF_MEMORY named (Slurm's memory poll cancels the step), no traceback;
- a job whose node (spare1, a partition of its own: no other test's job runs there) is set DOWN mid-run: NODE_FAIL;
- a job that succeeded but whose output was removed: said as not read, exit 4.

The kernel logs of the jobs' nodes come back over a new Slurm step (the jobs have ended) and over ssh.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import mldebug, validate_schema, wait_until
from tests.rig.fixtures import SlurmRig, load_nodes, load_ssh_rig

pytestmark = pytest.mark.rig

RAISE = """
import os, time
rank = int(os.environ["SLURM_PROCID"])
print("rank", rank, "starts on", os.uname().nodename, flush=True)
if rank == 1:
    raise ValueError("bad batch 7 on purpose")
time.sleep(1)
"""

# grows by 20 MiB every 0.1 s until Slurm's poll (every second) cancels the step over its 100M
HOG = """
import time
hold = []
for _ in range(600):
    hold.append(bytearray(20 << 20))
    time.sleep(0.1)
print("never killed", flush=True)
"""

WAIT = """
import time
print("ready", flush=True)
time.sleep(300)
"""


@dataclass
class Jobs:
    raise_job: str
    oom_job: str
    nodefail_job: str
    ok_job: str
    dirs: dict[str, Path]


def _submit(rig: SlurmRig, code: str, workdir: Path, *, nodes: int = 1, extra: tuple[str, ...] = ()) -> str:
    workdir.mkdir(parents=True, exist_ok=True)
    return rig.sbatch(["srun", "--label", "python3", "-c", code], nodes=nodes, srun=False,
                      output=workdir / "train-%j.out", extra=["--no-requeue", f"--chdir={workdir}", *extra])


@pytest.fixture(scope="module")
def jobs(rig_slurm: SlurmRig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    base = tmp_path_factory.mktemp("postmortem")
    os.chmod(base, 0o755)
    dirs = {name: base / name for name in ("raise", "oom", "nodefail", "ok")}
    submitted: list[str] = []
    with contextlib.ExitStack() as stack:
        yield from _run_jobs(rig_slurm, dirs, submitted, stack)


def _run_jobs(rig_slurm: SlurmRig, dirs: dict[str, Path], submitted: list[str], stack: contextlib.ExitStack
              ) -> Iterator[Jobs]:
    try:
        raise_job = _submit(rig_slurm, RAISE, dirs["raise"], nodes=2)
        submitted.append(raise_job)
        oom_job = _submit(rig_slurm, HOG, dirs["oom"], extra=("--mem=100M",))
        submitted.append(oom_job)
        ok_job = _submit(rig_slurm, "print('fine')", dirs["ok"])
        submitted.append(ok_job)
        # spare1 is taken down by one pytest worker at a time (each worker may run this fixture)
        spare = stack.enter_context(open(rig_slurm.base / "spare1.lock", "w"))
        fcntl.flock(spare, fcntl.LOCK_EX)
        nodefail_job = _submit(rig_slurm, WAIT, dirs["nodefail"], extra=("-p", "spare"))
        submitted.append(nodefail_job)
        out = dirs["nodefail"] / f"train-{nodefail_job}.out"
        wait_until(lambda: out.exists() and "ready" in out.read_text(), 120, "the spare node's job to start")
        try:
            down = rig_slurm.run(["scontrol", "update", "nodename=spare1", "state=down",
                                  "reason=mldebug test: node lost"])
            assert down.returncode == 0, down.stderr
            for job in submitted:
                rig_slurm.wait_end(job, timeout=180)
            # slurmdbd records a step's end a moment after the job leaves the queue
            for job in submitted:
                wait_until(lambda job=job: _accounted(rig_slurm, job, with_rss=job == oom_job), 60,
                           f"job {job}'s steps in the accounting")
        finally:
            rig_slurm.run(["scontrol", "update", "nodename=spare1", "state=resume"])
            wait_until(lambda: rig_slurm.run(["sinfo", "-h", "-N", "-n", "spare1", "-o", "%T"]).stdout.strip()
                       in ("idle", "mixed", "allocated"), 60, "spare1 back up")
            fcntl.flock(spare, fcntl.LOCK_UN)
        (dirs["ok"] / f"train-{ok_job}.out").unlink()
        yield Jobs(raise_job, oom_job, nodefail_job, ok_job, dirs)
    finally:
        for job in submitted:
            rig_slurm.cancel(job)


def _accounted(rig: SlurmRig, job: str, with_rss: bool) -> bool:
    """sacct has the job's final record (slurmdbd writes it a moment after the job leaves the queue, and a
    step's MaxRSS and the job's memory a moment apart): the job, its batch step and step 0, none still
    running, with the step's MaxRSS and the job's limit when asked."""
    from ml_debug.postmortem.accounting import SACCT_FIELDS, parse_sacct

    text = rig.run(["sacct", "-j", job, "-a", "--parsable2", "--noheader", "-o", ",".join(SACCT_FIELDS)]).stdout
    acc = parse_sacct(text, job)
    steps = {s.id: s for s in acc.steps}
    if acc.job is None or f"{job}.batch" not in steps or f"{job}.0" not in steps:
        return False
    if any(s.state in ("RUNNING", "PENDING", "COMPLETING") for s in [acc.job, *acc.steps]):
        return False
    return not with_rss or (steps[f"{job}.0"].max_rss is not None and acc.job.req_mem is not None)


def _logs(rig: SlurmRig, cwd: Path, *args: str, env: dict[str, str] | None = None
          ) -> tuple[subprocess.CompletedProcess[str], dict]:
    proc = mldebug("logs", "--json", *args, env={"SLURM_CONF": str(rig.conf), **(env or {})}, cwd=cwd, timeout=180)
    doc = json.loads(proc.stdout)
    validate_schema(doc, "logs")
    return proc, doc["result"]


def _logs_reading_kernels(rig: SlurmRig, cwd: Path, job: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str],
                                                                                         dict]:
    """`mldebug logs --slurm-job` whose new step on the job's nodes reads their kernel logs. The rig's nodes are
    shared by the tests: while another test's job holds one, the step cannot start (srun --immediate) and that node's
    log says so. Then, once the nodes are idle again, once more (at most three runs)."""
    def idle(nodes: str) -> bool:
        return set(rig.run(["sinfo", "-h", "-N", "-n", nodes, "-o", "%T"]).stdout.split()) <= {"idle"}

    for _ in range(3):
        proc, result = _logs(rig, cwd, "--slurm-job", job, env=env)
        held = ",".join(k["node"] for k in result["postmortem"]["kernel"] if "did not run there" in (k.get("reason") or ""))
        if not held:
            break
        wait_until(functools.partial(idle, held), 180, f"{held} idle, for the kernel-log step")
    return proc, result


def _a_rank_that_raised_is_named_with_its_node_exception_and_step_state(
        rig_slurm: SlurmRig, jobs: Jobs, tmp_path: Path) -> None:
    history = tmp_path / "history.db"
    proc, result = _logs_reading_kernels(rig_slurm, tmp_path, jobs.raise_job, env={"MLDEBUG_HISTORY": str(history)})
    assert proc.returncode == 1, proc.stderr
    pm = result["postmortem"]
    v = pm["verdict"]
    steps = {s["id"]: s for s in pm["accounting"]["steps"]}
    main = steps[f"{jobs.raise_job}.0"]
    assert main["state"] == "FAILED" and main["exit_code"] == 1 and main["ntasks"] == 2
    node_of_rank1 = pm["accounting"]["judgement"]["task_nodes"]["1"]
    assert (v["rank"], v["node"], v["named_by"]) == (1, node_of_rank1, "logs")
    assert "ValueError: bad batch 7 on purpose" in v["summary"]
    assert f"step {jobs.raise_job}.0 ended FAILED (exit code 1)" in v["summary"]
    assert result["summary"].startswith(f"rank 1 ({node_of_rank1}): ValueError")
    out = str(jobs.dirs["raise"] / f"train-{jobs.raise_job}.out")
    assert pm["files_read"] == [out] and pm["files_unreadable"] == []
    assert pm["slurm"]["known_by"] == "scontrol" and pm["slurm"]["stdout"] == out
    # the kernel log of each node, read by a new step on the job's nodes (the job has ended)
    kernel = {k["node"]: k for k in pm["kernel"]}
    assert sorted(kernel) == sorted(main["nodes"]), pm["kernel"]
    assert all(k["readable"] and k["source"] in ("journalctl", "dmesg") and k["lines"] > 0
               for k in kernel.values()), pm["kernel"]
    # recorded in the node history as a `mldebug logs` run, under the job's id
    with sqlite3.connect(history) as db:
        rows = db.execute("SELECT source, job, node, first FROM incidents ORDER BY node").fetchall()
    assert ("logs", f"slurm:{jobs.raise_job}", node_of_rank1, 1) in rows
    # the human view says the same, and which file it read
    text = mldebug("logs", "--slurm-job", jobs.raise_job, "--no-kernel-logs", env={"SLURM_CONF": str(rig_slurm.conf)},
                   cwd=tmp_path, timeout=120)
    assert text.returncode == 1
    assert f"rank 1 ({node_of_rank1}): ValueError: bad batch 7 on purpose; accounting: step {jobs.raise_job}.0 " \
           "ended FAILED (exit code 1)" in text.stdout
    assert f"post-mortem of Slurm job {jobs.raise_job}" in text.stdout and out in text.stdout
    # one rank's own lines, from the files the job left
    lines = mldebug("logs", "--slurm-job", jobs.raise_job, "--rank", "1", env={"SLURM_CONF": str(rig_slurm.conf)},
                    cwd=tmp_path, timeout=120)
    assert lines.returncode == 0 and lines.stdout.splitlines()[-1] == "ValueError: bad batch 7 on purpose"
    assert f"rank 1 starts on {node_of_rank1}" in lines.stdout and "rank 0" not in lines.stdout


def _a_task_over_its_memory_limit_is_named_out_of_memory_without_a_traceback(
        rig_slurm: SlurmRig, jobs: Jobs, tmp_path: Path) -> None:
    proc, result = _logs(rig_slurm, tmp_path, "--slurm-job", jobs.oom_job, "--no-kernel-logs")
    assert proc.returncode == 1, proc.stderr
    assert result["tracebacks"] == []
    v = result["postmortem"]["verdict"]
    assert (v["rank"], v["cause"], v["named_by"]) == (0, "oom", "accounting")
    judgement = result["postmortem"]["accounting"]["judgement"]
    assert v["node"] == judgement["node"] and v["node"] in ("node1", "node2", "node3")
    assert "no traceback" in v["summary"] and "OUT_OF_MEMORY" in v["summary"]
    assert "limit 100M" in v["summary"] and judgement["detail"]["max_rss"] >= 0.9 * 100 * 2**20


def _a_job_whose_node_went_down_is_named_node_fail(rig_slurm: SlurmRig, jobs: Jobs, tmp_path: Path) -> None:
    proc, result = _logs_reading_kernels(rig_slurm, tmp_path, jobs.nodefail_job, env={})
    assert proc.returncode == 1, proc.stderr
    v = result["postmortem"]["verdict"]
    assert (v["rank"], v["node"], v["cause"]) == (0, "spare1", "node-fail")
    assert "NODE_FAIL" in v["summary"] and "spare1 went DOWN (mldebug test: node lost)" in v["summary"]
    # spare1 is back: a new step in its partition read its kernel log
    assert [(k["node"], k["readable"]) for k in result["postmortem"]["kernel"]] == [("spare1", True)]


def _a_file_the_job_left_that_is_gone_is_said_and_the_result_is_partial(
        rig_slurm: SlurmRig, jobs: Jobs, tmp_path: Path) -> None:
    proc, result = _logs(rig_slurm, tmp_path, "--slurm-job", jobs.ok_job, "--no-kernel-logs")
    assert proc.returncode == 4, proc.stderr
    pm = result["postmortem"]
    assert not pm["verdict"]["failed"] and "COMPLETED" in pm["verdict"]["summary"]
    gone = str(jobs.dirs["ok"] / f"train-{jobs.ok_job}.out")
    assert pm["files_unreadable"] == [{"path": gone, "reason": "no such file here (written on another machine, "
                                                               "or removed?)"}]


def _kernel_logs_over_ssh_and_a_host_that_cannot_be_reached(rig_slurm: SlurmRig, jobs: Jobs,
                                                                tmp_path: Path) -> None:
    ssh = load_ssh_rig()
    proc, result = _logs(rig_slurm, tmp_path, "--slurm-job", jobs.raise_job, "--hosts", "node1,node2",
                         "--ssh-config", str(ssh.ssh_config))
    assert proc.returncode == 1, proc.stderr
    kernel = {k["node"]: k for k in result["postmortem"]["kernel"]}
    assert sorted(kernel) == ["node1", "node2"] and all(k["readable"] for k in kernel.values())
    proc, result = _logs(rig_slurm, tmp_path, "--slurm-job", jobs.ok_job, "--hosts", "node1,badkey",
                         "--ssh-config", str(ssh.ssh_config), "--node-timeout", "10")
    assert proc.returncode == 4, proc.stderr  # no failure; a file and a node not read
    kernel = {k["node"]: k for k in result["postmortem"]["kernel"]}
    assert kernel["node1"]["readable"] and not kernel["badkey"]["readable"]
    assert "host key" in kernel["badkey"]["reason"]


def _flight_recorder_dumps_on_the_nodes_come_back_with_the_kernel_logs(rig_slurm: SlurmRig, jobs: Jobs,
                                                                           tmp_path: Path) -> None:
    """Dumps in a node-local place (NCCL's TORCH_FR_DUMP_TEMP_FILE on a node's own /tmp: here a tmpfs mounted
    in the node's mount namespace only, so this machine does not see them), written after the job started,
    travel back with the node's kernel log. (The analysis of real dumps is tests/cli/test_logs_postmortem.py's.)"""
    from tests.unit.postmortem.test_frdumps import _dump

    node = next(n for n in load_nodes() if n.name == "node1")
    where = Path(tempfile.mkdtemp(prefix="mldpm-fr-", dir="/tmp"))
    inside = ["nsenter", "-t", str(node.init_pid), "-m", "--"]
    subprocess.run([*inside, "mount", "-t", "tmpfs", "-o", "size=1m", "mldpm-fr", str(where)], check=True, timeout=30)
    try:
        for r in range(2):
            subprocess.run([*inside, "sh", "-c", 'cat > "$1"', "sh", str(where / f"trace_{r}")], check=True,
                           input=_dump(r, ["all_reduce"] * (4 if r == 1 else 5), 4), timeout=30)
        assert list(where.iterdir()) == []  # node1's own: not seen here
        proc, result = _logs(rig_slurm, tmp_path, "--slurm-job", jobs.raise_job, "--fr-prefix", str(where / "trace_"))
        assert proc.returncode == 1, proc.stderr
        fr = result["postmortem"]["flight_recorder"]
        assert sorted(fr["files"]) == [f"node1:{where}/trace_0", f"node1:{where}/trace_1"]
        assert fr.get("analysis") and fr["analysis"]["findings"][0].startswith("rank 1 never issued collective #5"), fr
        v = result["postmortem"]["verdict"]
        assert v["rank"] == 1 and "flight-recorder: rank 1 never issued collective #5" in v["summary"]
        assert not any("Flight Recorder" in d for d in v["disagreements"])  # the logs name rank 1 too
    finally:
        subprocess.run([*inside, "umount", str(where)], timeout=30)
        shutil.rmtree(where, ignore_errors=True)


# Two tests, so that pytest-xdist hands both to one worker (two at a time) and the jobs run once.

def test_each_failed_job_is_named_from_its_id_alone(rig_slurm: SlurmRig, jobs: Jobs, tmp_path: Path) -> None:
    for i, check in enumerate((_a_rank_that_raised_is_named_with_its_node_exception_and_step_state,
                               _a_task_over_its_memory_limit_is_named_out_of_memory_without_a_traceback,
                               _a_job_whose_node_went_down_is_named_node_fail,
                               _a_file_the_job_left_that_is_gone_is_said_and_the_result_is_partial)):
        (tmp_path / str(i)).mkdir()
        check(rig_slurm, jobs, tmp_path / str(i))


def test_the_nodes_kernel_logs_and_dumps_over_ssh_and_a_slurm_step(rig_slurm: SlurmRig, jobs: Jobs,
                                                                   tmp_path: Path) -> None:
    (tmp_path / "ssh").mkdir()
    (tmp_path / "step").mkdir()
    _kernel_logs_over_ssh_and_a_host_that_cannot_be_reached(rig_slurm, jobs, tmp_path / "ssh")
    _flight_recorder_dumps_on_the_nodes_come_back_with_the_kernel_logs(rig_slurm, jobs, tmp_path / "step")
