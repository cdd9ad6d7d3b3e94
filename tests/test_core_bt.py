"""`mldebug core-bt` on real core files from real segfaulting Python processes."""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from ml_debug.stacks.cores import pattern_globs
from ml_debug.stacks.elfcore import is_core, read_notes
from tests.conftest import REPO, mldebug, require

SCHEMA = json.loads((REPO / "ml_debug" / "schemas" / "core-bt.json").read_text())
CRASH = "import ctypes\ndef crash_here():\n    ctypes.string_at(0)\ncrash_here()\n"


def _unlimited_core() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def _crash(cwd: Path) -> Path:
    """Run a Python process that segfaults in C (strlen(NULL) under ctypes.string_at) in `cwd`."""
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    require(not pattern.startswith("|") and not pattern.startswith("/"),
            f"core_pattern writing plain files in the crashing cwd (it is {pattern!r})")
    proc = subprocess.run([sys.executable, "-c", CRASH], cwd=cwd, preexec_fn=_unlimited_core, capture_output=True)
    assert proc.returncode == -11
    cores = [p for p in cwd.iterdir() if is_core(p)]
    require(cores, f"a core file in {cwd} (core_pattern {pattern!r}, ulimit -c)")
    return cores[0]


@pytest.fixture(scope="module")
def core_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cores")
    _crash(d)
    return d


def test_elf_notes_name_the_process_and_the_signal(core_dir: Path) -> None:
    core = next(p for p in core_dir.iterdir() if is_core(p))
    notes = read_notes(core)
    assert notes.signal_name == "SIGSEGV"
    assert notes.psargs and notes.psargs.startswith(sys.executable)
    assert Path(notes.files[0]).resolve() == Path(sys.executable).resolve()
    assert notes.threads >= 1 and notes.pid and notes.pid > 0


def test_core_bt_shows_the_crashing_c_frame_and_the_python_frames(core_dir: Path) -> None:
    require(shutil.which("gdb") or shutil.which("pystack"), "gdb or pystack")
    proc = mldebug("core-bt", "--json", cwd=core_dir, timeout=180)  # found through core_pattern in the cwd
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, SCHEMA)
    result = doc["result"]
    (core,) = result["cores"]
    assert core["ok"] and core["signal"] == "SIGSEGV"
    assert Path(core["executable"]).resolve() == Path(sys.executable).resolve()
    assert "strlen" in core["crash_frame"], core["crash_frame"]  # the C frame that faulted
    natives = [f["name"] for f in core["threads"][0]["native_frames"]]
    assert "string_at" in natives[:4]  # ctypes' C function right below it
    py = core["python_frames"]
    assert py[0].startswith("string_at (__init__.py:") and py[1:] == ["crash_here (<string>:3)",
                                                                      "<module> (<string>:4)"], py
    assert result["summary"].startswith("crash: ") and "SIGSEGV" in result["summary"]
    assert "crash_here" in result["summary"]

    human = mldebug("core-bt", str(core_dir), timeout=180)
    assert human.returncode == 1
    assert "crashing thread" in human.stdout and "crash_here (<string>:3)" in human.stdout
    assert "Python (innermost first)" in human.stdout


def test_cores_with_the_same_crash_are_grouped(core_dir: Path, tmp_path: Path) -> None:
    require(shutil.which("gdb") or shutil.which("pystack"), "gdb or pystack")
    for i in range(2):
        d = tmp_path / f"rank{i}"
        d.mkdir()
        _crash(d)
    proc = mldebug("core-bt", "--json", str(tmp_path / "rank0"), str(tmp_path / "rank1"), timeout=240)
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout)["result"]
    assert len(result["cores"]) == 2
    assert [g["count"] for g in result["groups"]] == [2]
    assert result["summary"].startswith("crash: 2 cores, 1 distinct crash(es)")


def test_no_core_found_is_exit_0(tmp_path: Path) -> None:
    proc = mldebug("core-bt", "--json", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)["result"]
    assert result["ok"] and result["cores"] == [] and result["summary"].startswith("no core files found")


def test_not_a_core_is_a_usage_error(tmp_path: Path) -> None:
    f = tmp_path / "core"
    f.write_text("not a core")
    proc = mldebug("core-bt", str(f), timeout=60)
    assert proc.returncode == 2
    assert "is not a core file" in proc.stderr


def test_core_pattern_to_globs() -> None:
    here = [Path("/w")]
    assert pattern_globs("core", False, here) == ["/w/core"]
    assert pattern_globs("core", True, here) == ["/w/core", "/w/core.*"]
    assert pattern_globs("/var/cores/core.%e.%p", True, here) == ["/var/cores/core.*.*"]
    assert pattern_globs("core-%%-%t", False, here) == ["/w/core-%-*"]
