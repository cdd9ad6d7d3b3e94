"""`mldebug trace-tail` on a trace file whose last line is 200 MB, beside one of the same size made of
short lines.

    python benchmarks/run.py trace_tail
    python benchmarks/bench_trace_tail.py [--mb 200]

Before the long-line fix (issue 31, item 4) the 200 MB line took 101 s and 697 MB and was printed
whole. Printed here, each read in a child process (so the peak is its own): the wall time beside
`tail -n 5` on the same file (a floor: it too must read back to the line's start, and prints the
whole line), the peak RSS beside the same size of short lines, and the size of the JSON document
(the long line is cut to 4096 bytes, with how much was cut).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.common import Result  # noqa: E402

HEADER = b"# nicertrace pid=100 host=h rank=0 mode=stream\n0:00:01.000 train.py:5: step()\n"
CHILD = """
import json, resource, sys, time
from ml_debug.core import output
from ml_debug.tracing.tail import tail_traces
t0 = time.perf_counter()
report = tail_traces([sys.argv[1]], lines=5)
doc = output.dumps(output.to_jsonable(report))
print(json.dumps({"seconds": time.perf_counter() - t0, "json_bytes": len(doc),
                  "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def _write(path: Path, mb: int, long_line: bool) -> None:
    chunk = b"A" * (1 << 20)
    with open(path / "trace-h-0-100.txt", "wb") as f:
        f.write(HEADER)
        if long_line:
            f.write(b"0:00:02.000 train.py:6: x = '")
            for _ in range(mb):
                f.write(chunk)
            f.write(b"'\n")
        else:
            line = b"0:00:02.000 train.py:6: x = 'short line of a normal trace, about eighty bytes'\n"
            block = line * ((1 << 20) // len(line))
            for _ in range(mb):
                f.write(block)


def _measure(path: Path) -> dict[str, float]:
    p = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=600,
                       env={"PYTHONPATH": str(HERE.parent), "PATH": "/usr/bin:/bin"})
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-1000:])
    result: dict[str, float] = json.loads(p.stdout.strip().splitlines()[-1])
    return result


def run(mb: int = 200) -> list[Result]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-trace-tail-"))
    try:
        (tmp / "long").mkdir()
        (tmp / "short").mkdir()
        _write(tmp / "long", mb, long_line=True)
        _write(tmp / "short", mb, long_line=False)
        long, short = _measure(tmp / "long"), _measure(tmp / "short")
        t0 = time.perf_counter()
        subprocess.run(["tail", "-n", "5", str(tmp / "long" / "trace-h-0-100.txt")], stdout=subprocess.DEVNULL,
                       check=True, timeout=600)
        tail_s = time.perf_counter() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [
        Result(f"trace-tail {mb} MB last line: time", long["seconds"] / tail_s,
               f"{long['seconds']:.2f} s vs {tail_s:.2f} s for `tail -n 5` of the same file"),
        Result(f"trace-tail {mb} MB last line: peak RSS", long["peak_kib"] / short["peak_kib"],
               f"{long['peak_kib'] / 1024:.0f} MiB vs {short['peak_kib'] / 1024:.0f} MiB"),
        Result(f"trace-tail {mb} MB last line: JSON size", long["json_bytes"] / short["json_bytes"],
               f"{long['json_bytes']:,} bytes vs {short['json_bytes']:,} bytes (the line cut to 4096 bytes)"),
    ]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    for r in run(ap.parse_args().mb):
        print(r.line())
