"""`mldebug health`: how long level 1 takes on this node, and whether the stress test's TFLOPs
figure is honest (its result checking must not slow the measured matmuls down).

    python benchmarks/run.py health

1. Level 1 wall time (what `mldebug check` pays): `mldebug health --level 1 --json` against
   `mldebug --help` (the CLI's own start-up), and the checks alone, in-process.
2. Stress TFLOPs against a bare `torch.matmul` loop of the same shape on the same device
   (cuda:0 when there is a GPU, else the CPU in float32), interleaved, median of 3: ratio ~1.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

from benchmarks.common import Result, timeit


def _cmd(argv: list[str]) -> float:
    def once() -> None:
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)

    return timeit(once, repeat=5)


def _level1() -> list[Result]:
    py = sys.executable
    help_ = _cmd([py, "-m", "ml_debug", "--help"])
    level1 = _cmd([py, "-m", "ml_debug", "health", "--level", "1", "--json"])
    from ml_debug.health.run import HealthOptions, run_local

    inproc = timeit(lambda: run_local(HealthOptions()), repeat=5)
    return [
        Result("health: level 1 CLI / mldebug --help", level1 / help_,
               f"{level1:.2f} s vs {help_:.2f} s start-up (checks alone in-process: {inproc * 1000:.0f} ms)"),
    ]


def _stress() -> list[Result]:
    import torch

    from ml_debug.health.stress import bare_matmul_tflops, matmul_stress

    if torch.cuda.is_available():
        device, dtype, n, seconds = "cuda:0", "bfloat16", 8192, 5.0
    else:
        device, dtype, n, seconds = "cpu", "float32", 1024, 3.0
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "0")) or torch.get_num_threads())
    ours, bare, iters = [], [], 0
    for _ in range(3):  # interleaved so a noisy neighbour hits both alike
        r = matmul_stress(device, dtype, n, seconds)
        if r.error:
            raise RuntimeError(r.error)
        ours.append(r.tflops)
        iters = r.iterations
        bare.append(bare_matmul_tflops(device, dtype, n, iters))
    mo, mb = statistics.median(ours), statistics.median(bare)
    return [Result(f"health: stress TFLOPs / bare matmul ({device})", mo / mb,
                   f"{mo:.3f} vs {mb:.3f} TFLOPs, {dtype} n={n}, {iters} iterations, median of 3")]


def run() -> list[Result]:
    return _level1() + _stress()


if __name__ == "__main__":
    for r in run():
        print(r.line())
