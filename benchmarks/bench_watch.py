"""`mldebug watch` overhead: CPU of the watcher per 8 ranks at the default settings, and the job's speed
watched vs unwatched, side by side on one job.

    python benchmarks/run.py watch

The job: `mldebug train --nproc-per-node 8 --preset tiny` (8 gloo ranks on this machine) writing per-rank
metrics. Its step rate is measured over WINDOW seconds unwatched, then over WINDOW seconds while
`mldebug watch --pid <job> --progress-file ...` runs with its default --interval (5 s) and --stack-every
(60 s: one py-spy round of all 8 ranks in the window). The watcher's CPU is everything it and its children
(py-spy) used, from the kernel's accounting of reaped children; its start-up (Python, imports, the first
sample) is measured on its own with a run of one interval and taken out, so "steady" is what watching
costs per second once it runs. The goal: under 1 % of one core per 8 ranks.

On many nodes each node runs `mldebug top`'s streaming agent instead (benchmarks/bench_top.py measures
its CPU); the in-process sampler measured here is the same code.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import Result, step_rate_result, steps, training_job

WINDOW = 60.0


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime



def _watch(job: int, metrics: Path, duration: float) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, exit code) of one `mldebug watch` run with the default settings."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    before, t0 = _children_cpu(), time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "ml_debug", "--json", "watch", "--pid", str(job), "--progress-file",
                           str(metrics / "rank-{rank}.jsonl"), "--duration", str(duration)],
                          capture_output=True, text=True, timeout=duration + 120, env=env)
    return _children_cpu() - before, time.monotonic() - t0, proc.returncode


def run() -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="bench-watch-") as tmp:
        metrics = Path(tmp) / "metrics"
        with training_job(metrics, WINDOW) as (job, unwatched):
            start_cpu, start_wall, _ = _watch(job, metrics, 5.0)  # start-up and one interval
            s0, t0 = steps(metrics), time.monotonic()
            cpu, wall, code = _watch(job, metrics, WINDOW + 5.0)
            watched = (steps(metrics) - s0) / (time.monotonic() - t0)
    total_pct = 100.0 * cpu / wall
    steady_pct = 100.0 * max(0.0, cpu - start_cpu) / max(1e-6, wall - start_wall)
    return [
        Result("watch: CPU % of one core, 8 ranks, steady", steady_pct,
               f"{cpu - start_cpu:.2f} s CPU over {wall - start_wall:.0f} s after start-up "
               f"(interval 5 s, one py-spy round per 60 s; goal < 1 %); exit {code}"),
        Result("watch: CPU % of one core, 8 ranks, with start-up", total_pct,
               f"{cpu:.2f} s CPU over {wall:.0f} s, start-up alone {start_cpu:.2f} s"),
        step_rate_result("watch: job step rate watched / unwatched", watched, unwatched, WINDOW),
    ]



if __name__ == "__main__":
    for r in run():
        print(r.line())
