"""`mldebug top` on a real GPU: NVML values through the gateway (no fake), and a process that keeps
cuda:0 busy shown as its rank with its GPU. Marked gpu: skipped without one.

    pytest -m gpu tests/gpu/test_top.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.conftest import REPO, mldebug
from tests.gpu.support import json_doc, need_gpus, repo_env

pytestmark = pytest.mark.gpu

MARKER = "mldebug-top-gpu-test"
# Keeps cuda:0 busy with matmuls until its stdin closes; says READY once the first one ran.
BUSY = ("import select, sys, torch\n"
        "a = torch.randn(4096, 4096, device='cuda:0'); b = a @ a; torch.cuda.synchronize()\n"
        "print('READY', flush=True)\n"
        "while not select.select([sys.stdin], [], [], 0)[0]:\n"
        "    for _ in range(20):\n"
        "        b = a @ a\n"
        "    torch.cuda.synchronize()\n")


@pytest.fixture
def busy_gpu() -> Iterator[subprocess.Popen[str]]:
    need_gpus(1)
    env = {**os.environ, **repo_env(), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")}
    proc = subprocess.Popen([sys.executable, "-c", BUSY, MARKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "READY", (line, proc.stderr.read() if proc.poll() is not None else "")
        yield proc
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_real_gpu_values_and_the_busy_process_on_its_gpu(busy_gpu: subprocess.Popen[str]) -> None:
    proc = mldebug("top", "--local", "--once", "--json", "--rank-rows", "--gpu-rows", "--pattern", MARKER,
                   env=repo_env(), timeout=180)
    assert proc.returncode in (0, 1), proc.stderr
    doc = json_doc(proc.stdout, proc.stderr, "top")
    (node,) = doc["result"]["nodes"]
    assert node["status"] == "ok" and node["nvml"]["available"] and node["nvml"]["source"] == "pynvml", node["nvml"]
    assert node["gpus"], "NVML sees GPUs, the sample lists none"
    for g in node["gpus"]:
        assert g["name"] and g["uuid"].startswith("GPU-") and g["bus_id"]
        assert 0 <= g["util_pct"] <= 100 and 0 < g["temp_c"] < 120
        assert 0 < g["power_w"] and 0 < g["power_limit_w"] and 0 < g["power_pct"] <= 150
        assert 0 < g["mem_used_bytes"] <= g["mem_total_bytes"]
        assert isinstance(g["throttle"], list) and g["pids"] is not None
    (rank,) = [r for r in node["ranks"] if r["pid"] == busy_gpu.pid]
    assert rank["label"] == "rank 0" and rank["gpu"] is not None and len(rank["gpu"]) == 1
    gpu = next(g for g in node["gpus"] if g["index"] == rank["gpu"][0])
    assert busy_gpu.pid in gpu["pids"]
    assert gpu["util_pct"] >= 10, gpu  # matmuls back to back: NVML sees the GPU busy
    assert rank["cpu_pct"] is not None and rank["rss_bytes"] > 0
