"""Asynchronous CUDA and NCCL errors (the seed handbook's section on them): `mldebug logs` names the rank and
says what the traceback cannot: the failing kernel ran earlier; rerun with CUDA_LAUNCH_BLOCKING=1
(`mldebug launch --cuda-sync`) or on the CPU. `mldebug launch --cuda-sync` sets the variables.

This machine has no GPU, so the lines are the exact text the libraries print, each with its source:
- "CUDA error: ..." and its suffix: c10/cuda/CUDAException.h (C10_CUDA_CHECK) and
  c10/cuda/CUDAMiscFunctions.cpp (get_cuda_check_suffix), torch 2.x;
- the device-side assert line: aten/src/ATen/native/cuda/IndexKernel.cu (CUDA_KERNEL_ASSERT), torch 2.x;
- the watchdog lines: torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (WorkNCCL::checkTimeout and
  ProcessGroupNCCL::Watchdog), torch 2.4.
"""

from __future__ import annotations

import json
from pathlib import Path

from ml_debug.logs.triage import triage
from tests.conftest import mldebug

SUFFIX = ("[rank{r}]: CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
          "below might be incorrect.\n[rank{r}]: For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
          "[rank{r}]: Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")


def _traceback(rank: int, error: str) -> str:
    return (f"[rank{rank}]: Traceback (most recent call last):\n"
            f'[rank{rank}]:   File "/job/train.py", line 88, in <module>\n'
            f"[rank{rank}]:     loss = model(batch).sum()\n"
            f"[rank{rank}]: RuntimeError: CUDA error: {error}\n" + SUFFIX.format(r=rank))


def _log(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.log"
    path.write_text(text)
    return str(path)


def test_a_device_side_assert_names_the_rank_and_says_the_kernel_ran_earlier(tmp_path: Path) -> None:
    text = ("[rank0]: step 10 loss 2.31\n"
            "[rank1]: /pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:93: operator(): block: [0,0,0], thread: "
            "[5,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && \"index out of bounds\"` failed.\n"
            + _traceback(1, "device-side assert triggered"))
    v = triage([_log(tmp_path, text)]).verdict
    assert v.failed and v.primary is not None and v.primary.who.rank == 1
    assert "device-side assert triggered" in v.primary.message
    assert v.hint is not None and "asynchronously" in v.hint and "CUDA_LAUNCH_BLOCKING=1" in v.hint
    assert "TORCH_USE_CUDA_DSA=1" in v.hint and "mldebug launch --cuda-sync" in v.hint
    assert 'CUDA_VISIBLE_DEVICES=""' in v.hint


def test_an_illegal_memory_access_gets_the_same_advice_without_dsa(tmp_path: Path) -> None:
    v = triage([_log(tmp_path, _traceback(3, "an illegal memory access was encountered"))]).verdict
    assert v.failed and v.primary is not None and v.primary.who.rank == 3
    assert v.hint is not None and "CUDA_LAUNCH_BLOCKING=1" in v.hint and "TORCH_USE_CUDA_DSA" not in v.hint


def test_nccl_operations_that_failed_or_timed_out_point_at_blocking_wait_and_the_interface(tmp_path: Path) -> None:
    watchdog = ("[rank{r}]:[E1127 10:00:00.000000000 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
                "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
                "ran for 600008 milliseconds before timing out.\n"
                "[rank{r}]:[E1127 10:00:00.000000000 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank "
                "{r}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, "
                "subsequent GPU operations might run on corrupted/incomplete data.\n")
    text = "".join(watchdog.format(r=r) for r in (0, 1, 3))
    proc = mldebug("logs", _log(tmp_path, text), "--json", timeout=60)
    result = json.loads(proc.stdout)["result"]
    hint = result["verdict"].get("hint") or ""
    assert "TORCH_NCCL_BLOCKING_WAIT=1" in hint and "NCCL_SOCKET_IFNAME" in hint, result["verdict"]
    assert proc.returncode == 1, proc.stderr


def test_launch_cuda_sync_sets_the_variables(tmp_path: Path) -> None:
    from ml_debug.launch.options import LaunchJobOptions
    from ml_debug.launch.run import plan

    on = plan(LaunchJobOptions(command=["train.py"], cuda_sync=True, log_dir=tmp_path), host="n1", environ={})
    assert {k: on.env[k] for k in ("CUDA_LAUNCH_BLOCKING", "TORCH_USE_CUDA_DSA", "TORCH_NCCL_BLOCKING_WAIT")} == \
        {"CUDA_LAUNCH_BLOCKING": "1", "TORCH_USE_CUDA_DSA": "1", "TORCH_NCCL_BLOCKING_WAIT": "1"}
    assert on.manifest["cuda_sync"] is True
    off = plan(LaunchJobOptions(command=["train.py"], log_dir=tmp_path), host="n1", environ={})
    assert "CUDA_LAUNCH_BLOCKING" not in off.env and off.manifest["cuda_sync"] is False
