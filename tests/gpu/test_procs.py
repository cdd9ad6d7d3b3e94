"""Finding the processes that hold a GPU (`dump-stacks --gpu-holders`, and the fallback when no launcher
and no rank variable point at a job), on a real GPU through NVML. Marked gpu: skipped without one.

    pytest -m gpu tests/gpu/test_procs.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.gpu.support import need_gpus, repo_env

pytestmark = pytest.mark.gpu

# Holds a CUDA context on cuda:0 (a tensor allocated there), says so, then waits for its stdin.
HOLDER = ("import sys, torch\n"
          "x = torch.ones(1 << 20, device='cuda:0'); torch.cuda.synchronize()\n"
          "print('READY', flush=True)\n"
          "sys.stdin.read()\n")


@pytest.fixture
def gpu_holder() -> Iterator[subprocess.Popen[str]]:
    need_gpus(1)
    env = {**os.environ, **repo_env(), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")}
    env.pop("RANK", None)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the child prints READY once its context exists, or dies
        assert line.strip() == "READY", (line, proc.stderr.read() if proc.poll() is not None else "")
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _wait_for_holder(pid: int, timeout: float = 30.0) -> list[int]:
    """NVML lists a new context within moments: poll for it (the list, once it has `pid` or at the deadline)."""
    from ml_debug.procs.find import gpu_holder_pids

    deadline = time.monotonic() + timeout
    while True:
        pids, why = gpu_holder_pids()
        assert why is None, why
        if pid in pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.2)


def test_gpu_holder_pids_lists_a_process_with_a_cuda_context(gpu_holder: subprocess.Popen[str]) -> None:
    pids = _wait_for_holder(gpu_holder.pid)
    if gpu_holder.pid not in pids and pids and not any(Path(f"/proc/{p}").exists() for p in pids):
        pytest.skip(f"NVML reports pids of another PID namespace ({pids}): a container without the host's "
                    "PID namespace; `--gpu-holders` cannot map them to processes here")
    assert gpu_holder.pid in pids, (gpu_holder.pid, pids)


def test_find_processes_gpu_selects_the_holder_with_its_command_line(gpu_holder: subprocess.Popen[str]) -> None:
    from ml_debug.procs.find import find_processes

    pids = _wait_for_holder(gpu_holder.pid)
    if gpu_holder.pid not in pids:
        pytest.skip(f"NVML does not list pid {gpu_holder.pid} (got {pids}); see the test above")
    found = find_processes(gpu=True)
    by_pid = {t.pid: t for t in found.processes}
    assert gpu_holder.pid in by_pid, (found.processes, found.notes)
    t = by_pid[gpu_holder.pid]
    assert t.found_by == "gpu" and "sys.stdin.read()" in t.cmdline, t
    assert os.getpid() not in by_pid  # never itself, though this process may hold a context too
