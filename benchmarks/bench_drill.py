"""`mldebug drill`: the time to verdict of every drill, beside the time its job took to reach the fault.

    python benchmarks/run.py drill

One `mldebug drill --json` run on this node (2 ranks per job, 4 for slow-link). Per drill: the seconds
from the start of the diagnosis a user would run (dump-stacks, watch, logs, gpu-test, allreduce-bench
--pairwise) to its verdict, every retry included, and the ratio to the seconds the job ran before the
diagnosis started (start-up, training to the fault step, or the whole job when it ends by itself).
Drills that are their own job (missing-rank, slow-link) show the ratio 1. A missed drill fails the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from benchmarks.common import Result

SEED = 11


def run() -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="bench-drill-") as tmp:
        proc = subprocess.run([sys.executable, "-m", "ml_debug", "drill", "--seed", str(SEED), "--bundle-dir", tmp,
                               "--json"], capture_output=True, text=True, timeout=1800,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    result = json.loads(proc.stdout)["result"]
    if proc.returncode != 0:
        raise RuntimeError(f"mldebug drill exit {proc.returncode}: {result['summary']}")
    out = []
    for d in result["drills"]:
        verdict, job = d["time_to_verdict_s"], d["job_s"] or 0.0
        ratio = verdict / job if job else 1.0
        out.append(Result(f"drill {d['drill']}: time to verdict / job to fault", ratio,
                          f"{verdict:.1f} s vs {job:.1f} s ({d['diagnosis'].split(' --')[0]})"))
    total = sum(d["time_to_verdict_s"] for d in result["drills"])
    out.append(Result("drill: all verdicts / whole drill run", total / result["wall_s"],
                      f"{total:.1f} s vs {result['wall_s']:.1f} s for {len(result['drills'])} drills"))
    return out
