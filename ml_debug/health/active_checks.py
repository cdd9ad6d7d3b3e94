"""Verdicts on the active tests: corruption, speed against the known peak, and the GPU that is
slower than the median of its identical siblings (the silicon is not equal; the outlier is what
matters). Pure functions over plain results: no torch here."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from ml_debug.health.gpu_checks import Thresholds
from ml_debug.health.result import Check, Status


def known_peak(name: str, dtype: str) -> float | None:
    """Vendor peak TFLOPs for a GPU model and dtype, or None when mldebug does not know it."""
    from ml_debug.core.gpu_peaks import peak_tflops

    return peak_tflops(name, {"bfloat16": "bf16", "float32": "fp32"}.get(dtype, ""))


def matmul_check(target: str, gpu_name: str, r: Any, th: Thresholds) -> Check:
    """Corruption and speed of one device's matmul stress (a stress.MatmulResult)."""
    src = f"matmul stress {r.dtype} n={r.n} on {r.device}, {r.iterations} iterations"
    data = {"tflops": round(r.tflops, 2), "iterations": r.iterations, "corrupt_iterations": r.corrupt_iterations,
            "inexact_iterations": r.inexact_iterations, "max_rel_error": r.max_rel_error, "dtype": r.dtype, "n": r.n}
    if r.error:
        return Check("gpu.matmul", target, Status.FAIL, "error", "runs", f"the stress test failed: {r.error}; "
                     "look for Xid in dmesg, then reset the GPU", src, data)
    value = f"{r.tflops:.1f} TFLOPs"
    peak = known_peak(gpu_name, r.dtype)
    if peak:
        value += f" ({r.tflops / peak:.0%} of {peak:.0f})"
        data["peak_tflops"] = peak
    if r.corrupt_iterations or not r.reference_ok:
        what = (f"{r.corrupt_iterations}/{r.iterations} results differed from the reference "
                f"(max rel error {r.max_rel_error:.2g})") if r.corrupt_iterations else "the reference result was wrong"
        return Check("gpu.matmul", target, Status.FAIL, value, "every result matches",
                     f"silent data corruption: {what}; drain this GPU, reset it and rerun; RMA if it repeats", src, data)
    thr = f"matches; >= {th.peak_fraction_min:.0%} of peak" if peak else "every result matches"
    if peak and r.tflops < th.peak_fraction_min * peak:
        return Check("gpu.matmul", target, Status.WARN, value, thr,
                     "well below this model's peak: look at clocks/power limit/thermal checks above; "
                     "the outlier check below says whether its siblings are as slow", src, data)
    if r.inexact_iterations:
        return Check("gpu.matmul", target, Status.WARN, value, thr,
                     f"{r.inexact_iterations} results differed from the first in low bits only: nondeterministic "
                     "math or small bit flips; rerun, and watch ECC counters", src, data)
    return Check("gpu.matmul", target, Status.PASS, value, thr, "", src, data)


def outlier_checks(cid: str, values: Sequence[tuple[str, str, float]], pct: float, unit: str,
                   severity: Status = Status.FAIL) -> list[Check]:
    """Flag any device more than `pct` % below the median of devices with the same model name.

    `values` is [(target, model name, measurement)]; models with one device get no verdict.
    """
    out: list[Check] = []
    groups: dict[str, list[tuple[str, float]]] = {}
    for target, name, v in values:
        groups.setdefault(name, []).append((target, v))
    for name, members in groups.items():
        if len(members) < 2:
            continue
        med = statistics.median(v for _, v in members)
        floor = med * (1 - pct / 100.0)
        for target, v in members:
            below = (1 - v / med) * 100 if med > 0 else 0.0
            value = f"{v:.1f} {unit} ({-below:+.0f}% vs median {med:.1f})"
            data = {"value": v, "median": med, "pct_below": round(below, 1), "peers": len(members)}
            if v < floor:
                out.append(Check(cid, target, severity, value, f">= {floor:.1f} (median -{pct:g}%)",
                                 f"{below:.0f}% slower than the median of its {len(members)} identical {name} GPUs: in "
                                 "synchronous training every rank waits for it; check its clocks/thermals/power above, "
                                 "reset it, or drain it", f"{cid.split('.')[-1]} across identical GPUs", data))
            else:
                out.append(Check(cid, target, Status.PASS, value, f">= {floor:.1f} (median -{pct:g}%)", "",
                                 f"{cid.split('.')[-1]} across identical GPUs", data))
    return out


# Usable unidirectional PCIe rate per lane in GB/s after line encoding, by generation.
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def copy_checks(target: str, r: Any, max_gen: Any, max_width: Any, th: Thresholds) -> list[Check]:
    """H2D and D2H bandwidth against what the GPU's PCIe link can carry (a stress.CopyResult)."""
    src = f"pinned copy {r.bytes >> 20} MiB on {r.device}, CUDA events"
    if r.error:
        return [Check("gpu.copy_bandwidth", target, Status.FAIL, "error", "runs", f"copy test failed: {r.error}", src)]
    link = None
    if isinstance(max_gen, int) and isinstance(max_width, int) and max_gen in PCIE_LANE_GBPS:
        link = PCIE_LANE_GBPS[max_gen] * max_width
    out = []
    for cid, gbps in (("gpu.h2d", r.h2d_gbps), ("gpu.d2h", r.d2h_gbps)):
        data = {"gbps": round(gbps, 2), "link_gbps": link}
        if link is None:
            out.append(Check(cid, target, Status.INFO, f"{gbps:.1f} GB/s", "link rate N/A", "", src, data))
        elif gbps < th.bandwidth_fraction_min * link:
            out.append(Check(cid, target, Status.WARN, f"{gbps:.1f} GB/s", f">= {th.bandwidth_fraction_min * link:.1f}"
                             f" ({th.bandwidth_fraction_min:.0%} of Gen{max_gen} x{max_width})",
                             "slow host<->device copies: data loading and offload stall; check the link under load, "
                             "NUMA placement (numactl) and IOMMU settings", src, data))
        else:
            out.append(Check(cid, target, Status.PASS, f"{gbps:.1f} GB/s",
                             f">= {th.bandwidth_fraction_min * link:.1f} ({th.bandwidth_fraction_min:.0%} of Gen{max_gen} "
                             f"x{max_width})", "", src, data))
    return out


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def memtest_check(target: str, r: Any) -> Check:
    src = f"pattern test on {r.device}: {r.passes} passes over {_size(r.bytes_tested)}"
    data = {"bytes_tested": r.bytes_tested, "mismatches": r.mismatches, "passes": r.passes}
    if r.error:
        return Check("gpu.memtest", target, Status.FAIL, "error", "runs", f"memory test failed: {r.error}", src, data)
    if r.mismatches:
        return Check("gpu.memtest", target, Status.FAIL, f"{r.mismatches} bad bytes/words", "0",
                     "device memory returned different data than was written: drain this GPU and reset it; RMA if "
                     "it repeats", src, data)
    return Check("gpu.memtest", target, Status.PASS, f"0 bad in {_size(r.bytes_tested)}", "0", "", src, data)
