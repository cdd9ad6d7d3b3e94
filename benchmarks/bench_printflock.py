"""printflock's cost per call against plain print, both writing to the same pipe."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import Result

REPO = Path(__file__).resolve().parents[1]
N = 20000
WRITER = f"""
import sys, time
sys.path.insert(0, {str(REPO)!r})
from ml_debug.printflock import printflock
fn = printflock if sys.argv[1] == "printflock" else print
line = "x" * int(sys.argv[2])
t0 = time.perf_counter()
for i in range({N}):
    fn(i, line)
sys.stderr.write(repr(time.perf_counter() - t0))
"""


def _per_call(kind: str, width: int, nproc: int = 1) -> float:
    """Mean seconds per call, with `nproc` writers sharing one pipe drained by this process."""
    r, w = os.pipe()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, kind, str(width)], stdout=w,
                              stderr=subprocess.PIPE, text=True) for _ in range(nproc)]
    os.close(w)
    with os.fdopen(r, "rb") as reader:
        while reader.read(1 << 20):
            pass
    times = [float(p.communicate(timeout=300)[1]) for p in procs]
    return sum(times) / len(times) / N


def run() -> list[Result]:
    out = []
    for width, nproc in ((80, 1), (4096, 1), (4096, 4)):
        plain = _per_call("print", width, nproc)
        locked = _per_call("printflock", width, nproc)
        out.append(Result(f"printflock/print per call ({width} B, {nproc} writer{'s' * (nproc > 1)})",
                          locked / plain, f"{locked * 1e6:.1f} us vs {plain * 1e6:.1f} us"))
    return out


if __name__ == "__main__":
    t = time.perf_counter()
    for r in run():
        print(r.line())
