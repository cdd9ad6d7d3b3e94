"""Cost of tracing a call-heavy workload: untraced, trace.Trace, NicerTrace, and excluded hot code.

    python benchmarks/run.py trace

Ratios are run time over the untraced run, measured side by side in one process. The same
measurements are repeated under a Python 3.12+ interpreter when one is found (sys.monitoring
backend): there, code that is not traced should cost nothing.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import trace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.common import Result, timeit  # noqa: E402
from ml_debug.nicertrace import NicerTrace  # noqa: E402

HOT = '''
def leaf(x):
    return x + 1


def mid(x):
    s = 0
    for i in range(10):
        s += leaf(i)
    return s


def work(n):
    t = 0
    for i in range(n):
        t += mid(i)
    return t
'''
N = 2000


def _measure(repeat: int = 3) -> list[tuple[str, float, str]]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-trace-"))
    try:
        hotdir = tmp / "hotpkg"
        hotdir.mkdir()
        (hotdir / "hotmod.py").write_text(HOT)
        sys.path.insert(0, str(hotdir))
        hot = importlib.import_module("hotmod")
        std_dirs = [sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]]
        sink = open(tmp / "stdtrace.txt", "w")  # noqa: SIM115  # trace.Trace prints: give it a file too

        def untraced() -> None:
            hot.work(N)

        def std(ignore: list[str]) -> None:
            with contextlib.redirect_stdout(sink):
                trace.Trace(count=0, trace=1, timing=True, ignoredirs=ignore).runfunc(hot.work, N)

        def floor() -> None:
            # The least any sys.settrace tracer can cost: a global trace function that returns None.
            sys.settrace(lambda frame, why, arg: None)
            try:
                hot.work(N)
            finally:
                sys.settrace(None)

        def nicer(**kw: object) -> None:
            NicerTrace(count=0, trace=1, out_dir=tmp / "out", **kw).runfunc(hot.work, N)

        base = timeit(untraced, repeat=repeat)
        cases = [
            ("trace.Trace (user code traced)", lambda: std(std_dirs)),
            ("NicerTrace stream (same include set)", lambda: nicer(packages_to_include="uninstalled")),
            ("NicerTrace ring=10000 (same include set)", lambda: nicer(packages_to_include="uninstalled", ring=10_000)),
            ("trace.Trace, hot code excluded", lambda: std([*std_dirs, str(hotdir)])),
            ("NicerTrace, hot code excluded", lambda: nicer(packages_to_include="uninstalled", ignoredirs=str(hotdir))),
        ]
        if sys.version_info < (3, 12):
            cases.append(("floor: sys.settrace(no-op), for reference", floor))
        rows = [("untraced", 1.0, f"{base * 1e3:.2f} ms for {N * 11} calls")]
        for name, fn in cases:
            t = timeit(fn, repeat=repeat)
            rows.append((name, t / base, f"{t * 1e3:.1f} ms"))
        sink.close()
        return rows
    finally:
        sys.path[:] = [p for p in sys.path if not p.startswith(str(tmp))]
        sys.modules.pop("hotmod", None)
        shutil.rmtree(tmp, ignore_errors=True)


def _newer_python() -> str | None:
    if sys.version_info >= (3, 12):
        return None
    for v in ("3.13", "3.12"):
        pyenv = sorted(Path("/root/.pyenv/versions").glob(f"{v}.*/bin/python{v}"))
        exe = str(pyenv[-1]) if pyenv else shutil.which(f"python{v}")
        if exe:
            return exe
    return None


def run() -> list[Result]:
    impl = f"py{sys.version_info.major}.{sys.version_info.minor}"
    results = [Result(f"{impl} {name}", ratio, detail) for name, ratio, detail in _measure()]
    other = _newer_python()
    if other:
        p = subprocess.run([other, __file__, "--child"], capture_output=True, text=True, timeout=600,
                           env={**os.environ, "PYTHONPATH": str(HERE.parent)})
        if p.returncode == 0:
            version, rows = json.loads(p.stdout.strip().splitlines()[-1])
            results += [Result(f"py{version} {name}", ratio, detail) for name, ratio, detail in rows]
        else:
            results.append(Result(f"{other} (sys.monitoring) FAILED", float("nan"), p.stderr[-300:]))
    return results


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        print(json.dumps([f"{sys.version_info.major}.{sys.version_info.minor}", _measure()]))
    else:
        for r in run():
            print(r.line())
