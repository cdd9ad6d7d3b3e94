"""`mldebug attach --eval` on a process that imported torch: gdb reading only the symbols the
injection needs (mldebug's default) against debugpy's default (every library's symbols).

    python benchmarks/run.py attach
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from benchmarks.common import Result, timeit

TARGET = "import torch, threading, time\nx = 0\nwhile True:\n    time.sleep(0.05)\n    x += 1\n"


def _attach(pid: int, scan: str) -> None:
    env = {**os.environ, "PYDEVD_GDB_SCAN_SHARED_LIBRARIES": scan}
    out = subprocess.run([sys.executable, "-m", "ml_debug", "--json", "attach", "--pid", str(pid), "--eval", "x"],
                         capture_output=True, text=True, timeout=300, env=env)
    if out.returncode != 0 or not json.loads(out.stdout)["result"]["ok"]:
        raise RuntimeError(f"attach failed: {out.stderr[-500:]}")


def run() -> list[Result]:
    from ml_debug.debugger.session import GDB_SCAN

    target = subprocess.Popen([sys.executable, "-c", TARGET], start_new_session=True)
    try:
        time.sleep(15)  # torch imported, the loop running
        narrow = timeit(lambda: _attach(target.pid, GDB_SCAN), repeat=3, warmup=0)
        full = timeit(lambda: _attach(target.pid, "."), repeat=3, warmup=0)
    finally:
        target.kill()
        target.wait()
    return [Result("attach: torch process, all symbols / needed ones", full / narrow,
                   f"{full * 1000:.0f} ms vs {narrow * 1000:.0f} ms (PYDEVD_GDB_SCAN_SHARED_LIBRARIES=. vs "
                   f"{GDB_SCAN})")]
