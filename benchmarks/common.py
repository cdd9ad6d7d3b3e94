"""Small helpers shared by the benchmark scripts: one Result line per measurement, and the 8-rank job that
the watch and exporter benchmarks measure beside their tool."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Result:
    """One benchmark line: a ratio measured side by side in one run, and what it compares."""

    name: str
    ratio: float
    detail: str

    def line(self) -> str:
        return f"{self.name:<44} ratio {self.ratio:8.3f}   {self.detail}"


def timeit(fn: Callable[[], object], repeat: int = 5, warmup: int = 1) -> float:
    """Median wall time of `fn` in seconds over `repeat` runs (after `warmup` runs)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


RANKS = 8
WARMUP = 20.0


def steps(metrics: Path) -> int:
    """The last step every rank of the job has written (its progress)."""
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


@contextmanager
def training_job(metrics: Path, window: float, env: dict[str, str] | None = None) -> Iterator[tuple[int, float]]:
    """`mldebug train --nproc-per-node 8 --preset tiny` writing per-rank metrics under `metrics`, once it trains
    (3 steps, then WARMUP s): its launcher's pid and its unwatched step rate over `window` s. Stopped on exit."""
    job = subprocess.Popen([sys.executable, "-m", "ml_debug", "train", "--nproc-per-node", str(RANKS),
                            "--preset", "tiny", "--steps", "1000000", "--collective-timeout", "600", "--stats-every", "0",
                            "--metrics-dir", str(metrics)], env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while steps(metrics) < 3:
            if job.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the 8-rank job did not start training")
            time.sleep(0.5)
        time.sleep(WARMUP)
        s0, t0 = steps(metrics), time.monotonic()
        time.sleep(window)
        yield job.pid, (steps(metrics) - s0) / (time.monotonic() - t0)
    finally:
        _stop(job)


def step_rate_result(name: str, rate: float, unwatched: float, window: float) -> Result:
    """The job's step rate beside a tool over its unwatched rate (the same job, `window` s each)."""
    return Result(name, rate / unwatched if unwatched else float("nan"),
                  f"{rate:.2f} vs {unwatched:.2f} steps/s of {RANKS} gloo ranks (same job, {window:.0f} s each)")


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
