"""Active tests (``--level 2/3``): matmul stress with a result check every iteration, a
device-memory pattern test, and host<->device copy bandwidth. torch is imported here only.

Timing measures the work itself (CUDA events around each matmul, or the wall clock on
CPU) so the correctness check never lowers the TFLOPs reported: benchmarks/bench_health.py
compares the figure with a bare ``torch.matmul`` loop of the same shape.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from ml_debug.core.errors import first_line

# Relative error (vs the largest reference value) above which a result is corrupt rather
# than rounded differently. Generous on purpose: bit flips in exponents/high mantissa bits
# are orders of magnitude larger; low-bit differences show up as `inexact` iterations.
TOLERANCE = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 5e-3}


@dataclass
class MatmulResult:
    """One device's matmul stress: speed and whether every result matched the reference."""

    device: str
    dtype: str
    n: int
    iterations: int = 0
    matmul_seconds: float = 0.0
    tflops: float = 0.0
    corrupt_iterations: int = 0  # differed from the reference beyond tolerance: silent corruption
    inexact_iterations: int = 0  # differed in low bits only: nondeterminism or small flips
    max_rel_error: float = 0.0
    reference_ok: bool = True  # the reference itself agreed with a float64 CPU spot check
    error: str | None = None


@dataclass
class MemtestResult:
    device: str
    bytes_tested: int = 0
    passes: int = 0
    mismatches: int = 0
    seconds: float = 0.0
    error: str | None = None


@dataclass
class CopyResult:
    device: str
    h2d_gbps: float = 0.0
    d2h_gbps: float = 0.0
    bytes: int = 0
    link_under_load: dict[str, Any] = field(default_factory=dict)  # NVML PCIe gen/width sampled during the copy
    error: str | None = None


def _torch() -> Any:
    import torch

    return torch


def _sync(torch: Any, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def make_operands(device: str, dtype: str, n: int, seed: int = 1234) -> tuple[Any, Any]:
    """Seeded random n x n operands (the same ones the benchmark's bare loop uses), made on the device."""
    torch = _torch()
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(n, n, generator=g, device=device, dtype=torch.float32).to(getattr(torch, dtype))
    b = torch.randn(n, n, generator=g, device=device, dtype=torch.float32).to(getattr(torch, dtype))
    return a, b


def _on(device: str) -> Any:
    """Make `device` current in this thread: CUDA events and streams belong to the current device."""
    torch = _torch()
    return torch.cuda.device(device) if device.startswith("cuda") else contextlib.nullcontext()


def matmul_stress(device: str, dtype: str = "bfloat16", n: int = 8192, duration_s: float = 10.0,
                  min_iterations: int = 3, max_iterations: int = 100_000,
                  inject_fault_at: int | None = None) -> MatmulResult:
    """Repeated C = A @ B for `duration_s`, every result compared with the first (gpu-burn's idea,
    plus a float64 CPU spot check of the reference). TFLOPs = 2 n^3 / time spent in matmul.
    `inject_fault_at=k` corrupts one element of iteration k's result (tests prove the check sees it)."""
    torch = _torch()
    res = MatmulResult(device, dtype, n)
    try:
        with _on(device):
            _matmul_loop(torch, res, device, dtype, n, duration_s, min_iterations, max_iterations, inject_fault_at)
    except Exception as e:  # OOM, a lost GPU (Xid 79 mid-run), a CUDA error: report, do not crash
        res.error = f"{type(e).__name__}: {first_line(e)}"
    return res


def _matmul_loop(torch: Any, res: MatmulResult, device: str, dtype: str, n: int, duration_s: float,
                 min_iterations: int, max_iterations: int, inject_fault_at: int | None) -> None:
    a, b = make_operands(device, dtype, n)
    c = torch.empty_like(a)
    torch.matmul(a, b, out=c)
    ref = c.to(torch.float32, copy=True)  # a copy: for float32, .float() would alias c
    # The reference must itself be right: a few rows against float64 on the CPU.
    rows, cols = min(16, n), min(256, n)
    exact = a[:rows].double().cpu() @ b[:, :cols].double().cpu()
    scale = float(exact.abs().max()) or 1.0
    tol = TOLERANCE.get(dtype, 2e-2)
    res.reference_ok = float((ref[:rows, :cols].double().cpu() - exact).abs().max()) / scale <= tol
    ref_scale = float(ref.abs().max()) or 1.0
    _sync(torch, device)
    cuda = device.startswith("cuda")
    # Size the run from a short warm-up so the loop itself never syncs.
    t0 = time.perf_counter()
    for _ in range(2):
        torch.matmul(a, b, out=c)
        (c.float() - ref).abs().max()
    _sync(torch, device)
    per_iter = max((time.perf_counter() - t0) / 2, 1e-6)
    iters = int(min(max(duration_s / per_iter, min_iterations), max_iterations))
    errs = torch.zeros(iters, device=device, dtype=torch.float32)
    if cuda:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    spent = 0.0
    for i in range(iters):
        if cuda:
            starts[i].record()
            torch.matmul(a, b, out=c)
            ends[i].record()
        else:
            t = time.perf_counter()
            torch.matmul(a, b, out=c)
            spent += time.perf_counter() - t
        if i == inject_fault_at:  # tests: a silent "bit flip" the check must catch
            c.view(-1)[n + 1] += 1e4
        # the check: stays on the device, no sync per iteration
        errs[i] = (c.float() - ref).abs().max()
    _sync(torch, device)
    if cuda:
        spent = sum(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)) / 1000.0
    rel = (errs / ref_scale).cpu()
    res.iterations = iters
    res.matmul_seconds = spent
    res.tflops = 2.0 * n**3 * iters / spent / 1e12 if spent > 0 else 0.0
    res.corrupt_iterations = int((rel > tol).sum())
    res.inexact_iterations = int(((rel > 0) & (rel <= tol)).sum())
    res.max_rel_error = float(rel.max())


def bare_matmul_tflops(device: str, dtype: str, n: int, iterations: int) -> float:
    """A bare ``torch.matmul`` loop of the same shape, timed by the wall clock: the benchmark's yardstick."""
    torch = _torch()
    with _on(device):
        return _bare_loop(torch, device, dtype, n, iterations)


def _bare_loop(torch: Any, device: str, dtype: str, n: int, iterations: int) -> float:
    a, b = make_operands(device, dtype, n)
    c = torch.empty_like(a)
    for _ in range(2):
        torch.matmul(a, b, out=c)
    _sync(torch, device)
    t0 = time.perf_counter()
    for _ in range(iterations):
        torch.matmul(a, b, out=c)
    _sync(torch, device)
    return 2.0 * n**3 * iterations / (time.perf_counter() - t0) / 1e12


PATTERNS = (0x00, 0xFF, 0xAA, 0x55)


def memory_test(device: str, fraction: float = 0.5, max_bytes: int | None = None,
                chunk_bytes: int = 1 << 30) -> MemtestResult:
    """Fill `fraction` of free device memory with fixed byte patterns and an address pattern,
    read each back and count mismatching words (a memtest for GPU memory)."""
    torch = _torch()
    res = MemtestResult(device)
    t0 = time.perf_counter()
    chunks: list[Any] = []
    try:
        if device.startswith("cuda"):
            free, _ = torch.cuda.mem_get_info(device)
            target = int(free * fraction)
        else:
            target = max_bytes or 64 << 20
        if max_bytes is not None:
            target = min(target, max_bytes)
        left = target
        while left >= 4096:
            size = min(chunk_bytes, left) // 4096 * 4096
            try:
                chunks.append(torch.empty(size, dtype=torch.uint8, device=device))
            except RuntimeError:  # another process took memory meanwhile: test what we got
                break
            left -= size
        bad = torch.zeros((), dtype=torch.int64, device=device)
        for p in PATTERNS:
            for ch in chunks:
                ch.fill_(p)
            # compare 8 bytes at a time: an int64 view is several times faster than bytes
            word = int.from_bytes(bytes([p]) * 8, "little", signed=True)
            for ch in chunks:
                bad += torch.count_nonzero(ch.view(torch.int64) != word)
            res.passes += 1
        # address pattern: each int32 word holds its own index, so stuck/aliased address lines show
        slice_words = 16 << 20
        for ch in chunks:
            words = ch.view(torch.int32)
            torch.arange(words.numel(), out=words, dtype=torch.int32)
        for ch in chunks:
            words = ch.view(torch.int32)
            for s in range(0, words.numel(), slice_words):
                e = min(s + slice_words, words.numel())
                bad += torch.count_nonzero(words[s:e] != torch.arange(s, e, dtype=torch.int32, device=device))
        res.passes += 1
        res.mismatches = int(bad)
        res.bytes_tested = sum(ch.numel() for ch in chunks)
    except Exception as e:
        res.error = f"{type(e).__name__}: {first_line(e)}"
    finally:
        chunks.clear()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    res.seconds = time.perf_counter() - t0
    return res


def copy_bandwidth(device: str, nbytes: int = 256 << 20, repeat: int = 10,
                   sample_link: Any = None) -> CopyResult:
    """Pinned host <-> device copy bandwidth in GB/s (1e9 B/s), timed with CUDA events;
    `sample_link()` is called while copies are in flight to read the PCIe link under load."""
    torch = _torch()
    res = CopyResult(device, bytes=nbytes)
    try:
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
        with torch.cuda.device(device):
            for direction in ("h2d", "d2h"):
                dev.copy_(host, non_blocking=True) if direction == "h2d" else host.copy_(dev, non_blocking=True)
                torch.cuda.synchronize(device)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(repeat):
                    if direction == "h2d":
                        dev.copy_(host, non_blocking=True)
                    else:
                        host.copy_(dev, non_blocking=True)
                end.record()
                if direction == "h2d" and sample_link is not None:
                    time.sleep(0.02)  # let the link leave its idle state before sampling
                    res.link_under_load = sample_link()
                torch.cuda.synchronize(device)
                gbps = nbytes * repeat / (start.elapsed_time(end) / 1000.0) / 1e9
                if direction == "h2d":
                    res.h2d_gbps = gbps
                else:
                    res.d2h_gbps = gbps
    except Exception as e:
        res.error = f"{type(e).__name__}: {first_line(e)}"
    return res
