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

import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import Result

RANKS = 8
WINDOW = 60.0
WARMUP = 20.0


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _steps(metrics: Path) -> int:
    """The last step every rank has written (the job's progress)."""
    last = []
    for r in range(RANKS):
        path = metrics / f"rank-{r}.jsonl"
        step = 0
        if path.exists():
            for line in path.read_text(errors="replace").splitlines()[-5:]:
                try:
                    step = max(step, int(json.loads(line).get("step") or 0))
                except (ValueError, AttributeError):
                    continue
        last.append(step)
    return min(last)


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
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        job = subprocess.Popen([sys.executable, "-m", "ml_debug", "train", "--nproc-per-node", str(RANKS),
                                "--preset", "tiny", "--steps", "1000000", "--timeout", "600", "--stats-every", "0",
                                "--metrics-dir", str(metrics)], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while _steps(metrics) < 3:
                if job.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the 8-rank job did not start training")
                time.sleep(0.5)
            time.sleep(WARMUP)
            s0, t0 = _steps(metrics), time.monotonic()
            time.sleep(WINDOW)
            unwatched = (_steps(metrics) - s0) / (time.monotonic() - t0)

            start_cpu, start_wall, _ = _watch(job.pid, metrics, 5.0)  # start-up and one interval
            s0, t0 = _steps(metrics), time.monotonic()
            cpu, wall, code = _watch(job.pid, metrics, WINDOW + 5.0)
            watched = (_steps(metrics) - s0) / (time.monotonic() - t0)
        finally:
            _stop(job)
    total_pct = 100.0 * cpu / wall
    steady_pct = 100.0 * max(0.0, cpu - start_cpu) / max(1e-6, wall - start_wall)
    return [
        Result("watch: CPU % of one core, 8 ranks, steady", steady_pct,
               f"{cpu - start_cpu:.2f} s CPU over {wall - start_wall:.0f} s after start-up "
               f"(interval 5 s, one py-spy round per 60 s; goal < 1 %); exit {code}"),
        Result("watch: CPU % of one core, 8 ranks, with start-up", total_pct,
               f"{cpu:.2f} s CPU over {wall:.0f} s, start-up alone {start_cpu:.2f} s"),
        Result("watch: job step rate watched / unwatched", watched / unwatched if unwatched else float("nan"),
               f"{watched:.2f} vs {unwatched:.2f} steps/s of {RANKS} gloo ranks (same job, {WINDOW:.0f} s each)"),
    ]


def _stop(job: subprocess.Popen[bytes]) -> None:
    """The launcher and its ranks (they live in the launcher's session: killed by pid, not by group)."""
    import psutil

    try:
        kids = psutil.Process(job.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        kids = []
    for p in [*kids]:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.kill(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    job.wait(timeout=30)
    psutil.wait_procs(kids, timeout=30)


if __name__ == "__main__":
    for r in run():
        print(r.line())
