"""`mldebug train` on real GPUs: CUDA, bf16 autocast, torchao float8, our MX quantiser, and the MFU
against the peak table; FSDP2 over NCCL where there are 2+ GPUs. Marked gpu: skipped without one.
Throughput figures live in benchmarks/gpu_train_mfu.py: here only what must hold on any GPU.

    pytest -m gpu tests/gpu/test_train.py
"""

from __future__ import annotations

import math

import pytest

from tests.conftest import mldebug
from tests.gpu.support import json_doc, need_gpus, need_module, repo_env

pytestmark = pytest.mark.gpu


def _train(*args: str, timeout: float = 420) -> dict:
    proc = mldebug("train", "--json", "--stats-every", "0", "--warmup-steps", "2", "--log-every", "100", *args,
                   timeout=timeout, env=repo_env())
    doc = json_doc(proc.stdout, proc.stderr, "train")
    assert proc.returncode == 0 and doc["result"]["ok"], (doc["result"]["summary"], proc.stderr[-3000:])
    return doc["result"]


def _check_throughput(r: dict, numerics: str) -> None:
    import torch

    from ml_debug.core.gpu_peaks import peak_tflops

    assert r["device"] == "cuda" and r["numerics"] == numerics, r
    losses = [r["losses"][k] for k in sorted(r["losses"], key=int)]
    assert all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0], f"loss did not go down: {losses}"
    assert r["tokens_per_s"] > 0 and r["tflops"] > 0 and r["step_time_s"] > 0
    peak = peak_tflops(torch.cuda.get_device_name(0), "fp8" if numerics in ("fp8", "mx") else "bf16")
    if peak is None:
        assert r["mfu"] is None  # a GPU the peak table does not know: no made-up MFU
        return
    # MFU is the model TFLOP/s over the table's peak, and no run beats the peak.
    assert r["mfu"] == pytest.approx(r["tflops"] / peak, rel=1e-6), (r["mfu"], r["tflops"], peak)
    assert 0 < r["mfu"] < 1, r["mfu"]


@pytest.mark.parametrize("numerics", ["bf16", "fp8", "mx"])
def test_125m_trains_on_one_gpu_and_reports_mfu(numerics: str) -> None:
    need_gpus(1)
    if numerics == "fp8":
        need_module("torchao", "float8 training (mldebug[train])")
    r = _train("--preset", "125m", "--numerics", numerics, "--steps", "8", "--batch-size", "4", "--seq-len", "512")
    assert r["world_size"] == 1
    _check_throughput(r, numerics)


def test_compiled_blocks_train_fp8_on_one_gpu() -> None:
    """--compile: torch.compile per block under torchao float8 (the combination fp8 needs to pay off)."""
    need_gpus(1)
    need_module("torchao", "float8 training (mldebug[train])")
    r = _train("--preset", "125m", "--numerics", "fp8", "--compile", "--steps", "8", "--batch-size", "4",
               "--seq-len", "512")
    _check_throughput(r, "fp8")


def test_1b_bf16_trains_on_one_gpu_and_reports_mfu() -> None:
    need_gpus(1)
    r = _train("--preset", "1b", "--numerics", "bf16", "--steps", "6", "--batch-size", "2", "--seq-len", "2048",
               "--lr", "1e-3")
    assert r["n_params"] > 0.9e9, r["n_params"]
    _check_throughput(r, "bf16")


def test_fsdp2_over_nccl_on_every_gpu() -> None:
    n = need_gpus(2)
    r = _train("--nproc-per-node", str(n), "--preset", "125m", "--numerics", "bf16", "--steps", "8",
               "--batch-size", "4", "--seq-len", "512")
    assert r["world_size"] == n
    _check_throughput(r, "bf16")
