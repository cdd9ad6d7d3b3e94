"""`mldebug health` on many nodes: the per-node JSON merged into one cluster result.

The first tests use the local transport (a real `mldebug health --local --json` subprocess);
the rig tests reach real sshd nodes (netns nodes with their own hostnames) and a Slurm job.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import jsonschema
import pytest

from ml_debug.core.output import document
from ml_debug.health.cluster import cluster_checks, merge
from ml_debug.remote.runner import run_mldebug_everywhere
from ml_debug.remote.targets import Target, TargetSpec
from tests.conftest import REPO, mldebug
from tests.fakes import HOOKS_ENV
from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import healthy_gpu

SCHEMA = json.loads((REPO / "ml_debug" / "schemas" / "health.json").read_text())
VENV_PYTHON = str(REPO / ".venv" / "bin" / "python")


def test_local_transport_result_merges_into_a_valid_cluster_result(tmp_path: Path) -> None:
    spec = TargetSpec(kind="local", targets=[Target(host=socket.gethostname())])
    agents = run_mldebug_everywhere(spec, ["health", "--path", str(tmp_path)], timeout_s=120)
    # the same mldebug, run locally: a parsed document and nothing to excuse
    assert agents[0].error is None, agents[0].error
    assert agents[0].document is not None and agents[0].document["schema"] == "mldebug.health"
    result = merge(agents, level=1, outlier_pct=10.0)
    jsonschema.validate(document("mldebug.health", 1, result), SCHEMA)
    [node] = result.nodes
    assert node["target"] == socket.gethostname() and result.unreachable == []
    assert result.exit_code == node["exit_code"]


def _node(target: str, driver: str, tflops: list[float], exit_code: int = 0) -> dict:
    gpus = [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(len(tflops))]
    checks = [{"id": "gpu.matmul", "target": f"gpu{i}", "status": "pass", "data": {"tflops": t}}
              for i, t in enumerate(tflops)]
    return {"target": target, "host": target, "ok": exit_code == 0, "exit_code": exit_code,
            "gpu": {"present": True, "driver_version": driver, "gpus": gpus}, "checks": checks}


def test_cluster_checks_flag_another_driver_and_a_slow_node() -> None:
    nodes = [_node("n1", "550.54.15", [700, 705]), _node("n2", "550.54.15", [698, 702]),
             _node("n3", "535.104.05", [560, 570])]
    checks = {c.id: c for c in cluster_checks(nodes, outlier_pct=10.0)}
    drv = checks["cluster.driver_match"]
    assert drv.status.value == "warn" and "n3" in drv.hint and "550.54.15" in drv.hint
    slow = checks["cluster.node_matmul_outlier"]
    assert slow.status.value == "fail" and slow.target == "n3" and "slower than the median" in slow.hint


# ------------------------------------------------------------------------------------- rig


def _scenarios(tmp_path: Path, names: list[str]) -> Path:
    """One fake-NVML scenario per node hostname: the second node has a pending row remap and an
    older driver (the fake is selected by the node's own hostname, on the node)."""
    d = tmp_path / "scenarios"
    d.mkdir()
    for i, name in enumerate(names):
        sick = healthy_gpu(1)
        if i == 1:
            sick["remapped_rows"] = [0, 1, 1, 0]
        (d / f"{name}.json").write_text(json.dumps({"driver_version": "535.104.05" if i == 1 else "550.54.15",
                                                    "gpus": [healthy_gpu(0), sick]}))
    return d


@pytest.mark.rig
def test_hosts_over_ssh_give_one_cluster_table(rig_ssh, tmp_path: Path, refused_port: int) -> None:
    nodes = rig_ssh.nodes[:2]
    scen = _scenarios(tmp_path, [n.name for n in nodes])
    dead = refused_port
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"{n.name}\n" for n in nodes) + f"127.0.0.1:{dead}\n")
    # The NVML fake is picked on each node, by the node's own hostname (test paths have no spaces).
    prefix = (f'export PYTHONPATH="{REPO}" {HOOKS_ENV}=tests.fakes.nvml '
              f'{fake_nvml.ENV}="{scen}/$(hostname).json"')
    args = ["health", "--hosts", str(hostfile), "--ssh-config", str(rig_ssh.ssh_config), "--identity",
            str(rig_ssh.client_key), "--remote-python", VENV_PYTHON, "--remote-prefix", prefix,
            "--connect-timeout", "3", "--path", "/tmp"]
    proc = mldebug(*args, "--json", timeout=180)
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, SCHEMA)
    result = doc["result"]
    assert proc.returncode == 1 == result["exit_code"]  # a failure found outranks the partial result
    by_target = {n["target"]: n for n in result["nodes"]}
    assert set(by_target) == {n.name for n in nodes}
    assert by_target[nodes[0].name]["host"] == nodes[0].name  # each node reported from its own hostname
    assert not by_target[nodes[1].name]["ok"] and "gpu1 row_remap" in by_target[nodes[1].name]["summary"]
    assert [u["host"] for u in result["unreachable"]] == [f"127.0.0.1:{dead}"]
    drv = next(c for c in result["cluster_checks"] if c["id"] == "cluster.driver_match")
    assert drv["status"] == "warn" and nodes[1].name in drv["hint"]
    human = mldebug(*args, timeout=180)
    assert human.returncode == 1
    assert "cluster" in human.stdout and "UNREACHED" in human.stdout and "FAIL" in human.stdout
    assert human.stdout.startswith("FAKE NVML: the GPU data of ") and "2 (FAKE NVML)" in human.stdout


@pytest.mark.rig
def test_slurm_job_nodes(rig_slurm, tmp_path: Path) -> None:
    job = rig_slurm.sbatch(["sleep", "120"], nodes=2)
    try:
        rig_slurm.wait_running(job, timeout=60)
        proc = mldebug("health", "--json", "--slurm-job", job, "--remote-python", VENV_PYTHON, "--path", "/tmp",
                       env=rig_slurm.env, timeout=180)
        doc = json.loads(proc.stdout)
        jsonschema.validate(doc, SCHEMA)
        result = doc["result"]
        assert len(result["nodes"]) == 2 and result["unreachable"] == [], result["unreachable"]
        assert {n["target"] for n in result["nodes"]} == set(rig_slurm.nodes[:2])
        assert all(n["gpu"]["present"] is False for n in result["nodes"])  # fake GRES, no NVIDIA driver
        assert proc.returncode == result["exit_code"]
    finally:
        rig_slurm.cancel(job)
