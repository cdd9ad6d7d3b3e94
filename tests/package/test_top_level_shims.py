"""`import printflock` / `import nicertrace` from an installed wheel, not from this checkout.

Code written for the standalone scripts says ``from printflock import printflock as print`` and
``from nicertrace import NicerTrace``. The wheel ships both names as top-level modules; this test
builds the wheel from a clean copy of the working tree (a stale build/ folder in the checkout
could hide a packaging mistake), installs it into an empty folder and imports from there with
nothing else on the path: ``python -S`` drops site-packages (and with it the editable install of
this checkout), the working directory is outside the repo. No torch is installed or imported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

CHECK = r'''
import os, sys
site = sys.argv[1]
from printflock import printflock as print
from nicertrace import NicerTrace
import ml_debug, nicertrace, printflock
for module in (ml_debug, nicertrace, printflock):
    assert module.__file__.startswith(site + os.sep), (module.__name__, module.__file__)
assert printflock.printflock is sys.modules["ml_debug.printflock"].printflock
assert NicerTrace is sys.modules["ml_debug.nicertrace"].NicerTrace
assert set(printflock.__all__) <= set(dir(printflock))

import work
tracer = NicerTrace(out_dir="traces")
assert tracer.runfunc(work.answer) == 42
print("printflock says", 42)
heavy = sorted(name for name in ("torch", "rich", "typer", "paramiko") if name in sys.modules)
print("heavy:", heavy)
'''


def _clean_copy(dest: Path) -> None:
    """The files a fresh checkout of this working tree has: tracked plus untracked, not ignored."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, text=True, timeout=60, check=True).stdout
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if src.is_file():  # a tracked file deleted in the working tree is not copied
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def test_wheel_ships_printflock_and_nicertrace_as_top_level_imports(tmp_path: Path) -> None:
    src, wheels, site, cwd = (tmp_path / d for d in ("src", "wheels", "site", "elsewhere"))
    for d in (src, wheels, site, cwd):
        d.mkdir()
    _clean_copy(src)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "--no-index", "-q", "-w", str(wheels), str(src)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("mldebug-*.whl")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                              "--target", str(site), str(wheel)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    assert (site / "printflock.py").is_file() and (site / "nicertrace.py").is_file()

    (cwd / "check.py").write_text(CHECK)
    (cwd / "work.py").write_text("def answer():\n    return 6 * 7\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(site),
           "HOME": str(tmp_path), "MLDEBUG_PRINTFLOCK_PATH": str(tmp_path / "print.lock")}
    run = subprocess.run([sys.executable, "-S", "check.py", str(site)], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-2:] == ["printflock says 42", "heavy: []"]
    traces = list((cwd / "traces").glob("trace-*.txt"))
    assert len(traces) == 1 and "answer" in traces[0].read_text()
