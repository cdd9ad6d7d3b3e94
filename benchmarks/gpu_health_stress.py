"""health's matmul stress on a GPU: its TFLOPs against a bare matmul loop and against the peak table.

    python benchmarks/gpu_health_stress.py [--out FILE.json] [--budget-s 90]

1. Library, cuda:0, interleaved 3 times (stress, bare, stress, bare, ...): the stress test's TFLOPs
   (CUDA events around each matmul, a result check between them) / a bare ``torch.matmul`` loop of the
   same shape and iteration count timed by the wall clock. Goal >= 0.97: checking every result must
   not cost measured speed. Both also as a share of the GPU's dense bf16 peak (core/gpu_peaks.py).
2. The command users run, ``mldebug health --level 2 --json``: each GPU's gpu.matmul TFLOPs over the
   bare loop's median (all GPUs stress at once there, the bare loop ran alone on cuda:0).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_common import Budget, Figure, Report, gpu_name, json_result, run, shell  # noqa: E402

N, DTYPE, ROUNDS = 8192, "bfloat16", 3


def library(report: Report, seconds: float) -> float | None:
    """Interleaved stress vs bare loop on cuda:0; returns the bare loop's median TFLOPs."""
    from ml_debug.core.gpu_peaks import peak_tflops
    from ml_debug.health.stress import bare_matmul_tflops, matmul_stress

    ours, bare, iters = [], [], 0
    for _ in range(ROUNDS):
        r = matmul_stress("cuda:0", DTYPE, N, seconds)
        if r.error:
            report.error(f"matmul_stress on cuda:0: {r.error}")
            return None
        if r.corrupt_iterations or not r.reference_ok:
            report.error(f"matmul_stress on cuda:0 saw {r.corrupt_iterations} corrupt results (reference ok: "
                         f"{r.reference_ok})")
        ours.append(r.tflops)
        iters = r.iterations
        bare.append(bare_matmul_tflops("cuda:0", DTYPE, N, iters))
    mo, mb = statistics.median(ours), statistics.median(bare)
    cmd = f"python benchmarks/gpu_health_stress.py  # matmul_stress('cuda:0', '{DTYPE}', {N}, {seconds:g})"
    ratio = mo / mb
    report.add(Figure("health stress TFLOPs / bare matmul loop (cuda:0)", ratio, "x", cmd, ">= 0.97", ratio >= 0.97,
                      f"stress {mo:.1f} vs bare {mb:.1f} TFLOPs, {DTYPE} n={N}, {iters} iterations, median of "
                      f"{ROUNDS} interleaved; each: {', '.join(f'{a:.1f}/{b:.1f}' for a, b in zip(ours, bare, strict=True))}"))
    name = gpu_name(0)
    peak = peak_tflops(name, "bf16")
    if peak:
        report.add(Figure("health stress TFLOPs / dense bf16 peak (cuda:0)", mo / peak, "of peak", cmd, "",
                          None, f"{mo:.1f} of {peak:.0f} TFLOPs ({name}); the bare loop reaches {mb / peak:.1%}"))
    else:
        report.note(f"no peak in ml_debug/core/gpu_peaks.py for {name!r}: no % of peak")
    return mb


def cli(report: Report, bare: float | None, seconds: float, timeout: float) -> None:
    argv = [sys.executable, "-m", "ml_debug", "health", "--level", "2", "--json", "--stress-seconds", f"{seconds:g}",
            "--memtest-fraction", "0.2", "--path", "/tmp"]
    rc, out, err, took = run(argv, timeout)
    result = json_result(out)
    if result is None:
        report.error(f"{shell(argv)} printed no JSON (rc {rc}): {err[-1500:]}")
        return
    node = result["nodes"][0]
    for c in node["checks"]:
        if c["id"] != "gpu.matmul":
            continue
        tflops = c["data"].get("tflops")
        peak = c["data"].get("peak_tflops")
        detail = f"{c['status']}: {c['value']}; run took {took:.0f} s, exit {rc}"
        if bare and tflops:
            report.add(Figure(f"health --level 2 {c['target']} TFLOPs / bare loop on cuda:0", tflops / bare, "x",
                              shell(argv), ">= 0.97", tflops / bare >= 0.97, detail))
        if peak and tflops:
            report.add(Figure(f"health --level 2 {c['target']} TFLOPs / peak", tflops / peak, "of peak",
                              shell(argv), "", None, f"{tflops:.1f} of {peak:.0f} TFLOPs"))
    for c in node["checks"]:
        if c["id"] in ("gpu.h2d", "gpu.d2h") and "gbps" in c.get("data", {}):
            report.add(Figure(f"health --level 2 {c['target']} {c['id'][4:]} copy bandwidth", c["data"]["gbps"],
                              "GB/s", shell(argv), "", None, f"{c['status']}: {c['value']} (threshold "
                              f"{c['threshold']})"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--budget-s", type=float, default=120.0, help="stop starting new parts after this long")
    args = ap.parse_args(argv)
    report = Report("gpu_health_stress")
    budget = Budget(args.budget_s)
    try:
        import torch
    except ImportError as e:
        report.error(f"torch is not importable: {e}")
        return report.write(args.out)
    if not torch.cuda.is_available():
        report.error(f"torch {torch.__version__} sees no CUDA device: nothing to measure")
        return report.write(args.out)
    seconds = 3.0 if budget.allows(70) else 2.0
    bare = library(report, seconds)
    if budget.allows(25):
        cli(report, bare, 6.0, budget.left() - 3)
    else:
        report.note("skipped `mldebug health --level 2`: out of time budget")
    return report.write(args.out)


if __name__ == "__main__":
    sys.exit(main())
