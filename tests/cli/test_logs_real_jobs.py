"""`mldebug logs` on logs written by real jobs: 4 gloo ranks, one of which fails.

Each job is launched for real (plain torchrun with --tee/--role, `mldebug launch` with `mldebug train
--inject crash`, a rank killing itself with SIGKILL, `srun --label` under the rig's Slurm), and the
verdict must name the failing rank and its cause and class every other rank as secondary.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ml_debug.logs.result import PRIMARY, SECONDARY, LogsReport
from ml_debug.logs.triage import triage
from tests.conftest import REPO
from tests.rig.fixtures import rig_port

WORKER = REPO / "tests" / "jobs" / "logs_worker.py"
HOST = socket.gethostname().split(".")[0]
NRANKS = 3  # on this node; the Slurm jobs run 2 nodes x 2 ranks


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                "MLDEBUG_JSON", "MLDEBUG_LOG_DIR"):
        env.pop(var, None)
    return env


def _torchrun(tmp: Path, fault: str, culprit: int, role: bool) -> tuple[int, Path, Path]:
    """Run the worker under plain torchrun --tee 3 (and --role HOST: when asked); (rc, console, log dir)."""
    logdir = tmp / "torchelastic"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={NRANKS}",
            "--max-restarts=0", "--tee=3", f"--log-dir={logdir}"]
    if role:
        argv += ["--role", f"{HOST}:"]
    console = tmp / "console.log"
    with open(console, "wb") as out:
        p = subprocess.run([*argv, str(WORKER)], stdout=out, stderr=subprocess.STDOUT, timeout=180, cwd=tmp,
                           env=_env(LOGS_FAULT=fault, LOGS_RANK=str(culprit)))
    return p.returncode, console, logdir


def _check(report: LogsReport, culprit: int, cause: str, world: int = NRANKS) -> None:
    """The verdict names `culprit` and `cause`; every other rank failed after it (secondary)."""
    v = report.verdict
    assert v.status == "failure", v.summary
    assert v.primary is not None and v.primary.who.rank == culprit, v.summary
    assert v.primary.cls == PRIMARY
    assert cause in v.primary.message, v.summary
    assert v.summary.startswith(f"first failure: rank {culprit}"), v.summary
    assert not v.independent, v.summary
    followed = {r for row in v.secondary for r in _expand(row["ranks"])}
    assert followed == set(range(world)) - {culprit}, v.summary
    others = [e for e in report.events if e.who.rank not in (culprit, None) and e.cls in (PRIMARY, SECONDARY)]
    assert others and all(e.cls == SECONDARY or not e.strong for e in others), \
        [(e.who.rank, e.cls, e.message) for e in others]


def _expand(text: str) -> list[int]:
    from ml_debug.core.ranges import expand

    return expand(text)


def test_torchrun_tee_role_console_and_log_dir_each_name_the_raising_rank(tmp_path: Path) -> None:
    """Plain torchrun --tee 3 --role HOST: , rank 2 raises a ValueError; its console, its --log-dir tree, and
    both together (each failure counted once). One job: a module-scoped one would run once per xdist worker."""
    rc, console, logdir = _torchrun(tmp_path, "raise", 2, role=True)
    assert rc != 0
    # the console alone
    text = console.read_text()
    assert f"[{HOST}:2]:" in text  # the --role prefix really is there
    report = triage([str(console)])
    _check(report, 2, "ValueError: bad batch on rank 2")
    assert report.verdict.primary is not None and report.verdict.primary.who.node == HOST
    primary_tb = [g for g in report.tracebacks if g.cls == PRIMARY]
    assert primary_tb and primary_tb[0].ranks == "2" and "raise ValueError" in "\n".join(primary_tb[0].text)
    # the log-dir tree alone
    assert list(logdir.rglob("attempt_0/2/stderr.log"))
    report = triage([str(logdir)])
    v = report.verdict
    assert v.primary is not None and v.primary.who.rank == 2, v.summary
    assert "ValueError: bad batch on rank 2" in v.primary.message
    assert {s.shape for s in report.sources} == {"torchelastic"}
    # both together: each failure counted once
    both = triage([str(console), str(logdir)])
    _check(both, 2, "ValueError: bad batch on rank 2")
    primary = [e for e in both.events if e.cls == PRIMARY and e.strong]
    assert [e.who.rank for e in primary] == [2], [(e.who, e.message, e.source) for e in primary]


def test_sigkilled_rank_is_named_from_torchrun_summary(tmp_path: Path) -> None:
    rc, console, _ = _torchrun(tmp_path, "sigkill", 1, role=False)
    assert rc != 0
    assert "[default1]:" in console.read_text()
    report = triage([str(console)])
    _check(report, 1, "SIGKILL")
    assert report.verdict.primary is not None and report.verdict.primary.kind == "signal"


def test_mldebug_launch_with_train_inject_crash(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    p = subprocess.run([sys.executable, "-m", "ml_debug", "launch", "--nproc-per-node", str(NRANKS),
                        "--log-dir", str(logs), "--", "python", "-m", "ml_debug.train", "--preset", "tiny",
                        "--steps", "4", "--collective-timeout", "30", "--inject", "crash@step=2,rank=2"],
                       capture_output=True, text=True, timeout=240, cwd=tmp_path, env=_env())
    assert p.returncode == 1, p.stderr[-3000:]
    node = logs / HOST
    manifest = json.loads((node / "launch.json").read_text())
    assert manifest["node"] == HOST and manifest["exit_code"] == 1
    console = (node / "console.log").read_text()
    assert f"[{HOST}:2 rank2]:" in console  # node, local rank and global rank on every rank line
    assert list(node.rglob("attempt_0/2/error.json")), "torchrun gave rank 2 its TORCHELASTIC_ERROR_FILE"
    assert "mldebug logs: first failure: rank 2" in p.stderr  # the verdict, printed at once
    report = triage([str(logs)])
    _check(report, 2, "injected crash on rank 2 at step 2")
    assert report.verdict.primary is not None and report.verdict.primary.who.node == HOST
    assert {s.shape for s in report.sources} == {"launch", "error-file", "torchelastic"}
    primary = [e for e in report.events if e.cls == PRIMARY and e.strong]
    assert [e.who.rank for e in primary] == [2], [(e.who, e.message, e.source) for e in primary]

    demux = subprocess.run([sys.executable, "-m", "ml_debug", "logs", str(logs), "--rank", "2"],
                           capture_output=True, text=True, timeout=60, env=_env())
    assert demux.returncode == 0, demux.stderr
    lines = demux.stdout.splitlines()
    assert "mldebug: error: injected crash on rank 2 at step 2" in lines
    assert not any(line.startswith("[") and "rank" in line.split("]")[0] for line in lines), lines[:5]


@pytest.mark.rig
def test_srun_label_job_under_slurm(rig_slurm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "slurm.out"
    nodes = rig_slurm.nodes[:2]
    env = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "eth0",
           "MASTER_ADDR": rig_slurm.node_ips[nodes[0]], "MASTER_PORT": str(rig_port()),
           "LOGS_FAULT": "raise", "LOGS_RANK": "2", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    job = rig_slurm.sbatch(["srun", "--label", sys.executable, str(WORKER)], nodes=2, ntasks_per_node=2,
                           env=env, output=out, srun=False, extra=["-w", ",".join(nodes), "--time=00:03:00"])
    try:
        rig_slurm.wait_end(job, timeout=180)
    finally:
        rig_slurm.cancel(job)
    text = out.read_text()
    assert "2: " in text and "srun: error:" in text, text[-3000:]
    report = triage([str(out)])
    _check(report, 2, "ValueError: bad batch on rank 2", world=4)
    assert report.verdict.primary is not None and report.verdict.primary.who.node == nodes[1], \
        report.verdict.summary


@pytest.mark.rig
def test_launch_sbatch_template_under_slurm(rig_slurm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """slurm/launch.sbatch: one `mldebug launch` per node (2 x 2 ranks, c10d rendezvous); rank 2 raises."""
    nodes = rig_slurm.nodes[:2]
    env = {**rig_slurm.env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
           "GLOO_SOCKET_IFNAME": "eth0", "MASTER_ADDR": rig_slurm.node_ips[nodes[0]],
           "MASTER_PORT": str(rig_port()), "GPUS_PER_NODE": "2",
           "MLDEBUG_SCRIPT": str(WORKER), "LOGS_FAULT": "raise", "LOGS_RANK": "2"}
    for var in ("MLDEBUG_JSON", "MLDEBUG_LOG_DIR", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(var, None)
    p = subprocess.run(["sbatch", "--parsable", f"--chdir={tmp_path}", "--nodes=2", "--gpus-per-node=2",
                        "--cpus-per-task=1", "--time=00:05:00", "-w", ",".join(nodes),
                        str(REPO / "slurm" / "launch.sbatch")],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    job = p.stdout.strip().split(";")[0]
    try:
        rig_slurm.wait_end(job, timeout=180)
    finally:
        rig_slurm.cancel(job)
    log = (tmp_path / f"mldebug-launch-{job}.out").read_text()
    assert "Exited with exit code 1" in log, log[-3000:]  # the node of rank 2 ended the step
    assert "mldebug logs: first failure: rank 2" in log, log[-3000:]
    report = triage([str(tmp_path / "mldebug-logs" / job)])
    _check(report, 2, "ValueError: bad batch on rank 2", world=4)
    assert sorted({s.path.split("/")[-2] for s in report.sources if s.shape == "launch"}) == sorted(nodes)
