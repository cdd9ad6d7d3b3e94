"""What a user waits for on a GPU node, each as the command they type: `mldebug health` (level 1)
beside `mldebug --help`, `mldebug dump-stacks` of a hung 1-GPU NCCL job with and without NCCL's
Flight Recorder pipe, and `mldebug check` end to end.

    python benchmarks/gpu_user_timings.py [--out FILE.json] [--budget-s 120] [--repeat 3]

Each figure is the median wall time of --repeat runs (check runs once), measured in this one run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_common import REPO, Budget, Figure, Report, env_with_repo, run, shell  # noqa: E402

# A one-rank NCCL job that stops after three all_reduces and sleeps: what a hung rank looks like.
HUNG = r'''
import json, os, time
from datetime import timedelta
import torch
import torch.distributed as dist

torch.cuda.set_device(0)
dist.init_process_group("nccl", timeout=timedelta(seconds=3600), device_id=torch.device("cuda", 0))
t = torch.ones(1024, device="cuda")
for _ in range(3):
    dist.all_reduce(t)
torch.cuda.synchronize()
with open(os.environ["HUNG_MARKER"], "w") as f:
    json.dump({"pid": os.getpid()}, f)
while True:
    time.sleep(3600)
'''


def timed(report: Report, name: str, argv: list[str], repeat: int, timeout: float,
          ok_codes: tuple[int, ...] = (0, 1)) -> float | None:
    """Median seconds of ``repeat`` runs; None (and an error) when a run fails."""
    times = []
    for _ in range(repeat):
        rc, out, err, took = run(argv, timeout)
        if rc not in ok_codes:
            report.error(f"{name}: {shell(argv)} exit {rc}: {err[-800:]}")
            return None
        times.append(took)
    value = statistics.median(times)
    report.add(Figure(name, value, "s", shell(argv), detail=f"median of {repeat}: "
                      + ", ".join(f"{t:.2f}" for t in times)))
    return value


def hung_job(tmp: Path) -> tuple[subprocess.Popen[bytes], int, str]:
    script, marker, pipe = tmp / "hung.py", tmp / "hung.json", str(tmp / "fr_pipe_")
    script.write_text(HUNG)
    env = env_with_repo(OMP_NUM_THREADS="1", HUNG_MARKER=str(marker), TORCH_NCCL_DEBUG_INFO_PIPE_FILE=pipe,
                        TORCH_NCCL_DEBUG_INFO_TEMP_FILE=str(tmp / "fr_trace_"), TORCH_FR_BUFFER_SIZE="2000",
                        TORCH_NCCL_TRACE_BUFFER_SIZE="2000", TORCH_NCCL_ENABLE_MONITORING="1")
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                            str(script)], env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (marker.exists() and Path(f"{pipe}0.pipe").exists()):
        if job.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the hung NCCL job did not reach its hang point (rc {job.poll()})")
        time.sleep(0.2)
    return job, json.loads(marker.read_text())["pid"], pipe


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--budget-s", type=float, default=120.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    report = Report("gpu_user_timings")
    budget = Budget(args.budget_s)
    mld = [sys.executable, "-m", "ml_debug"]
    help_s = timed(report, "mldebug --help", [*mld, "--help"], args.repeat, 30, (0,))
    health_s = timed(report, "mldebug health (level 1, every GPU)", [*mld, "health", "--json", "--path", "/tmp"],
                     args.repeat, 60)
    if help_s and health_s:
        report.add(Figure("mldebug health level 1 / mldebug --help", health_s / help_s, "x",
                          "python benchmarks/gpu_user_timings.py", detail="wall time ratio, medians"))
    with tempfile.TemporaryDirectory(prefix="mldebug-timings-") as tmp:
        job = None
        try:
            job, pid, _ = hung_job(Path(tmp))
            for fr in (True, False):
                if not budget.allows(30):
                    report.note(f"skipped dump-stacks {'with' if fr else 'without'} the Flight Recorder: budget")
                    continue
                timed(report, f"dump-stacks of a hung 1-GPU NCCL job, Flight Recorder {'on' if fr else 'off'}",
                      [*mld, "dump-stacks", "--local", "--pid", str(job.pid), "--json",
                       "--flight-recorder" if fr else "--no-flight-recorder"], args.repeat, 90)
            del pid
        except RuntimeError as e:
            report.error(str(e))
        finally:
            if job is not None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait(timeout=30)
    if budget.allows(40):
        rc, out, err, took = run([*mld, "check", "--json"], max(30.0, budget.left() - 5))
        verdict = "no JSON"
        try:
            verdict = json.loads(out)["result"]["summary"]
        except (ValueError, KeyError, TypeError):
            pass
        report.add(Figure("mldebug check end to end", took, "s", "python -m ml_debug check --json",
                          detail=f"exit {rc}: {verdict}"[:400]))
        if rc not in (0, 1):
            report.error(f"mldebug check exit {rc}: {err[-800:]}")
    else:
        report.note("skipped mldebug check: budget")
    return report.write(args.out)


if __name__ == "__main__":
    sys.exit(main())
