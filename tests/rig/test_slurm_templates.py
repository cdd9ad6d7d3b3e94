"""The sbatch templates in slurm/ run for real on the rig's Slurm cluster (2 nodes, CPU ranks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema

from tests.conftest import REPO

# The rig's fake nodes have 2 fake GPUs and 8 CPUs each; the templates ask for 8 GPUs per node.
SMALL = ["--nodes=2", "--gpus-per-node=2", "--cpus-per-task=1", "--time=00:05:00"]


def _sbatch(rig_slurm, template: str, tmp_path: Path, *extra: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    bindir = str(Path(sys.executable).parent)
    job_env = {**rig_slurm.env, "PATH": f"{bindir}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
               "MASTER_ADDR": rig_slurm.node_ips[rig_slurm.nodes[0]], **(env or {})}
    out = subprocess.run(["sbatch", "--parsable", f"--chdir={tmp_path}", *SMALL, *extra,
                          str(REPO / "slurm" / template)],
                         capture_output=True, text=True, timeout=60, env=job_env)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    rc = rig_slurm.wait_end(job, timeout=240)
    log = next(tmp_path.glob(f"*-{job}.out"), None)
    return rc, job, log.read_text() if log else ""


def test_gpu_test_template_reports_every_rank(rig_slurm, tmp_path: Path):  # type: ignore[no-untyped-def]
    # Also the suite's check of gpu-test under Slurm: srun's world (launcher, ranks, hosts, node ranks).
    rc, job, log = _sbatch(rig_slurm, "gpu-test.sbatch", tmp_path, "--ntasks-per-node=2",
                           env={"MLDEBUG_ARGS": "--stage-timeout 60"})
    assert rc == 0, log
    assert "4/4 ranks OK on 2 hosts" in log
    out = tmp_path / f"mldebug-gpu-test-{job}"
    assert sorted(p.name for p in out.glob("gpu-test.rank*.jsonl")) == [f"gpu-test.rank{r:05d}.jsonl" for r in range(4)], \
        "each rank writes its own result line under --out-dir"
    doc = json.loads((out / "gpu-test.json").read_text())  # rank 0's verdict over every rank
    jsonschema.validate(doc, json.loads((REPO / "ml_debug" / "schemas" / "gpu-test.json").read_text()))
    res = doc["result"]
    assert res["ok"], log[-3000:]
    assert res["launcher"] == "slurm" and res["world_size"] == 4
    ids = sorted((x["identity"] for x in res["ranks"]), key=lambda i: i["rank"])
    assert [i["rank"] for i in ids] == [0, 1, 2, 3]
    assert [i["node_rank"] for i in ids] == [0, 0, 1, 1]
    assert sorted(i["host"] for i in ids) == sorted(rig_slurm.nodes[:2] * 2)
    assert ids[0]["host"] == ids[1]["host"] != ids[2]["host"] == ids[3]["host"]


def test_health_template_writes_one_json_per_node(rig_slurm, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Level 2 logs its stress on stderr: that goes to <node>.log, never into <node>.json (which then did
    not parse); the failing nodes are listed right (grep -L's exit status said "none" the wrong way round)."""
    rc, job, log = _sbatch(rig_slurm, "health.sbatch", tmp_path,
                           env={"MLDEBUG_LEVEL": "2", "MLDEBUG_ARGS": "--stress-seconds 0.1"})
    assert rc == 0, log
    out = tmp_path / f"mldebug-health-{job}"
    per_node = sorted(out.glob("*.json"))
    assert [p.stem for p in per_node] == rig_slurm.nodes[:2]
    failing = []
    for path in per_node:
        doc = json.loads(path.read_text())
        assert doc["schema"] == "mldebug.health"
        assert "matmul stress" in (out / f"{path.stem}.log").read_text()
        if not doc["result"]["ok"]:
            failing.append(str(path))
    listed = log.split("failing nodes:\n", 1)[1].splitlines()
    assert listed == (failing or ["  none"]), log


def test_allreduce_bench_template_saves_the_json(rig_slurm, tmp_path: Path):  # type: ignore[no-untyped-def]
    rc, job, log = _sbatch(rig_slurm, "allreduce-bench.sbatch", tmp_path, "--ntasks-per-node=1",
                           env={"MLDEBUG_ARGS": "--quick --collective-timeout 60"})
    assert rc == 0, log
    doc = json.loads((tmp_path / f"mldebug-allreduce-{job}" / "allreduce.json").read_text())
    assert doc["schema"] == "mldebug.allreduce-bench"
    assert doc["result"]["ok"] is True, doc["result"]["summary"]
    assert "2 ranks on 2 node" in doc["result"]["summary"]


def test_sweep_template_resubmits_once_and_stops_on_its_stop_file(rig_slurm, tmp_path: Path):  # type: ignore[no-untyped-def]
    """slurm/sweep.sbatch on one node: a run queues exactly one next run (--begin=now+1hour); a second
    run while that one waits queues none; with the stop file the waiting run starts, does nothing and
    queues nothing. Dry-run hook on the shared rig: it reads node states and changes none."""
    name = f"mldebug-sweep-t{os.getpid()}"
    bindir = str(Path(sys.executable).parent)
    env = {**rig_slurm.env, "PATH": f"{bindir}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
           "MLDEBUG_LEVEL": "1", "MLDEBUG_ARGS": f"--dry-run --history {tmp_path}/h/history.db"}

    def submit() -> str:
        out = subprocess.run(["sbatch", "--parsable", f"--chdir={tmp_path}", f"--job-name={name}", "--nodes=1",
                              "--cpus-per-task=1", "--time=00:05:00", str(REPO / "slurm" / "sweep.sbatch")],
                             capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().split(";")[0]

    def pending() -> list[str]:
        return rig_slurm.run(["squeue", "-h", "-n", name, "-t", "PENDING", "-o", "%i"]).stdout.split()

    try:
        first = submit()
        assert rig_slurm.wait_end(first, timeout=120) == 0, (tmp_path / f"{name}-{first}.out").read_text()
        log = (tmp_path / f"{name}-{first}.out").read_text()
        queued = pending()
        assert len(queued) == 1 and f"next run is job {queued[0]} (begins now+1hour)" in log, log
        assert "would" not in log and ": healthy" in log  # the hook ran on the node, healthy, changed nothing
        begin = rig_slurm.run(["squeue", "-h", "-j", queued[0], "-o", "%r"]).stdout.strip()
        assert begin == "BeginTime", begin

        second = submit()  # by hand, while the next run waits: no second pending copy
        assert rig_slurm.wait_end(second, timeout=120) == 0
        assert "next run already queued" in (tmp_path / f"{name}-{second}.out").read_text()
        assert pending() == queued

        (tmp_path / "mldebug-sweep.stop").touch()
        assert rig_slurm.run(["scontrol", "update", f"jobid={queued[0]}", "StartTime=now"]).returncode == 0
        assert rig_slurm.wait_end(queued[0], timeout=120) == 0
        assert "not resubmitting" in (tmp_path / f"{name}-{queued[0]}.out").read_text()
        assert pending() == []
    finally:
        rig_slurm.run(["scancel", "-n", name])
