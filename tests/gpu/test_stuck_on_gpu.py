"""A rank stuck on the GPU: blocked in `torch.cuda.synchronize()` or `tensor.item()` behind a kernel that
runs for minutes (torch's own spin kernel, `torch.cuda._sleep`). `mldebug dump-stacks` must say the rank
waits on the GPU, in the groups and the verdict and below Python, not that it is idle or in Python.
The catalogue of blocking CUDA calls: ml_debug/stacks/gpu_waits.py (its pure test:
tests/unit/stacks/test_gpu_waits.py). Marked gpu: skipped without one.

    pytest -m gpu tests/gpu/test_stuck_on_gpu.py
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import mldebug, require
from tests.gpu.support import json_doc, need_gpus, repo_env

pytestmark = pytest.mark.gpu

WORKER = r'''
import os, sys
import torch

mode, marker = sys.argv[1], sys.argv[2]
x = torch.ones(1024, device="cuda")
torch.cuda.synchronize()
torch.cuda._sleep(int(2.5e9 * 600))  # a kernel that spins for about ten minutes (at most 2.5 GHz)
with open(marker + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(marker + ".tmp", marker)
if mode == "synchronize":
    torch.cuda.synchronize()
else:
    print(x.sum().item())
'''


def _start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[bytes], Path]:
    script = tmp_path / "stuck_on_gpu.py"
    script.write_text(WORKER)
    marker = tmp_path / f"{mode}.pid"
    job = subprocess.Popen([sys.executable, str(script), mode, str(marker)], env={**os.environ, **repo_env()},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert job.poll() is None, f"the GPU job ended early (rc {job.returncode})"
        assert time.monotonic() < deadline, "the GPU job never reached its synchronising call"
        time.sleep(0.2)
    time.sleep(1)  # from the marker to the blocking call: a few Python lines
    return job, marker


@pytest.mark.parametrize(("mode", "native"), [("synchronize", False), ("synchronize", True), ("item", True)])
def test_a_rank_behind_a_long_kernel_is_said_to_wait_on_the_gpu(tmp_path: Path, mode: str, native: bool) -> None:
    need_gpus(1)
    require(shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy").exists(), "py-spy")
    job, _ = _start(tmp_path, mode)
    try:
        args = ["dump-stacks", "--pid", str(job.pid), "--json"] + (["--native"] if native else [])
        proc = mldebug(*args, timeout=180, env=repo_env())
        doc = json_doc(proc.stdout, proc.stderr, "dump-stacks")
        result = doc["result"]
        assert len(result["groups"]) == 1, result["summary"]
        wait = result["groups"][0]["gpu_wait"]
        kernel = result["processes"][0].get("kernel") or {}
        if mode == "synchronize":  # torch.cuda.synchronize: the Python frame says it, native frames or not
            assert wait is not None, (result["verdict"], result["groups"][0]["frames"][:8])
            assert "wait on the GPU in" in result["verdict"], result["verdict"]
            if kernel.get("verdict"):
                assert kernel["verdict"].startswith("waiting on the GPU in"), kernel
        elif wait is not None:  # .item(): py-spy unwound the CUDA runtime's frames
            assert "ynchron" in wait["name"] or "memcpy" in wait["name"].lower(), wait
            assert "wait on the GPU in" in result["verdict"], result["verdict"]
        else:  # py-spy could not unwind into the CUDA driver: the kernel's view says it instead
            assert "/dev/nvidia" in kernel.get("verdict", "") and "waiting on the GPU" in kernel["verdict"], kernel
            assert "waiting on the GPU" in result["summary"], result["summary"]
        human = mldebug(*[a for a in args if a != "--json"], timeout=180, env=repo_env())
        assert "GPU" in human.stdout, human.stdout[-3000:]
        assert job.poll() is None, "dumping must leave the rank running"
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=60)
