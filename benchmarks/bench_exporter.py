"""`mldebug exporter` cost: its CPU per scrape and per rank beside an unwatched job of 8 ranks, and the job's
speed exported vs not, side by side on one job.

    python benchmarks/run.py exporter

The job: `mldebug train --nproc-per-node 8 --preset tiny` (8 gloo ranks on this machine) writing per-rank
metrics. Its step rate is measured over WINDOW seconds with no exporter, then over WINDOW seconds while
`mldebug exporter --progress-file ...` samples it at its defaults (ranks every 5 s, health checks every
60 s) and is scraped every 15 s, as a Prometheus server would. The exporter's CPU comes from the kernel's
accounting of its process (/proc/PID/stat, every thread): over the window (sampling + the scrapes), over
SCRAPES back-to-back scrapes (per scrape), and for a second exporter that finds no rank (the base:
per rank = the difference / 8). The goal: under 1 % of one core for 8 ranks at a 15 s scrape interval.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.common import RANKS, Result, step_rate_result, steps, training_job

WINDOW = 60.0
SCRAPE_EVERY = 15.0
SCRAPES = 50


def _cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:  # noqa: S310 - loopback
        return str(r.read().decode())


class _Exporter:
    def __init__(self, *args: str) -> None:
        self.port = _free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "ml_debug", "exporter", "--listen",
                                      f"127.0.0.1:{self.port}", *args], env={**os.environ, "OMP_NUM_THREADS": "1"},
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                if "mldebug_exporter_samples_total" in _scrape(self.port):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the exporter did not start")
            time.sleep(0.2)
        time.sleep(6.0)  # past start-up: the first health run and one rank sample

    def window(self, seconds: float) -> tuple[float, float, int]:
        """(CPU seconds, wall seconds, series of the last scrape) over `seconds`, scraped every SCRAPE_EVERY."""
        c0, t0 = _cpu(self.proc.pid), time.monotonic()
        lines = 0
        while time.monotonic() - t0 < seconds:
            lines = sum(1 for line in _scrape(self.port).splitlines() if line and not line.startswith("#"))
            time.sleep(min(SCRAPE_EVERY, max(0.0, seconds - (time.monotonic() - t0))))
        return _cpu(self.proc.pid) - c0, time.monotonic() - t0, lines

    def per_scrape(self) -> float:
        """CPU seconds per scrape, over SCRAPES back-to-back scrapes (the sampling between them subtracted
        at its own rate, measured just before)."""
        idle_cpu, idle_wall, _ = self.window_without_scrapes(5.0)
        c0, t0 = _cpu(self.proc.pid), time.monotonic()
        for _ in range(SCRAPES):
            _scrape(self.port)
        cpu, wall = _cpu(self.proc.pid) - c0, time.monotonic() - t0
        return max(0.0, cpu - idle_cpu / idle_wall * wall) / SCRAPES

    def window_without_scrapes(self, seconds: float) -> tuple[float, float, int]:
        c0, t0 = _cpu(self.proc.pid), time.monotonic()
        time.sleep(seconds)
        return _cpu(self.proc.pid) - c0, time.monotonic() - t0, 0

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def run() -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="bench-exporter-") as tmp:
        metrics = Path(tmp) / "metrics"
        exporters: list[_Exporter] = []
        with training_job(metrics, WINDOW, {"MLDEBUG_BENCH_JOB": "exporter"}) as (_, unwatched):
            try:
                job_args = ["--env", "MLDEBUG_BENCH_JOB=exporter", "--progress-file",
                            str(metrics / "rank-{rank}.jsonl")]
                exporters.append(_Exporter(*job_args))
                s0, t0 = steps(metrics), time.monotonic()
                cpu, wall, series = exporters[0].window(WINDOW)
                exported = (steps(metrics) - s0) / (time.monotonic() - t0)
                scrape_cpu = exporters[0].per_scrape()
                exporters[0].close()

                exporters.append(_Exporter("--env", "MLDEBUG_BENCH_JOB=nobody"))  # the same node, no rank found
                base_cpu, base_wall, base_series = exporters[1].window(WINDOW)
            finally:
                for e in exporters:
                    if e.proc.poll() is None:
                        e.close()
    pct = 100.0 * cpu / wall
    base_pct = 100.0 * base_cpu / base_wall
    per_rank_pct = max(0.0, pct - base_pct) / RANKS
    return [
        Result("exporter: CPU % of one core, 8 ranks, 15 s scrapes", pct,
               f"{cpu:.2f} s CPU over {wall:.0f} s (ranks every 5 s, health every 60 s, a scrape of {series} "
               f"series every {SCRAPE_EVERY:g} s; goal < 1 %)"),
        Result("exporter: CPU ms per scrape, 8 ranks", 1000.0 * scrape_cpu,
               f"over {SCRAPES} back-to-back scrapes of {series} series"),
        Result("exporter: CPU % of one core per rank", per_rank_pct,
               f"(8 ranks {pct:.3f} % - no rank {base_pct:.3f} % ({base_series} series)) / {RANKS}"),
        step_rate_result("exporter: job step rate exported / not", exported, unwatched, WINDOW),
    ]


if __name__ == "__main__":
    for r in run():
        print(r.line())
