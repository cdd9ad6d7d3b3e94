"""`mldebug core-bt` on real core files from real segfaulting Python processes."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from ml_debug.core.extras import find_program
from ml_debug.stacks.cores import pattern_globs
from ml_debug.stacks.elfcore import is_core, read_notes
from ml_debug.stacks.parsers import parse_pystack
from tests.conftest import REPO, mldebug, require, stderr_until

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


def _core(core_dir: Path) -> Path:
    return next(p for p in core_dir.iterdir() if is_core(p))


def _python_frames_of_crash(core: dict) -> None:
    py = core["python_frames"]
    assert py[0].startswith("string_at (__init__.py:") and py[1:] == ["crash_here (<string>:3)",
                                                                      "<module> (<string>:4)"], py


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
    _python_frames_of_crash(core)
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


def test_pystack_core_thread_headers_without_a_thread_name() -> None:
    """`pystack core` (1.7) leaves out the thread name that `pystack remote` prints."""
    text = ('Traceback for thread 12387 [Has the GIL] (most recent call last):\n'
            '    (Python) File "<string>", line 3, in crash_here\n'
            'Traceback for thread 12390 (most recent call last):\n'
            '    (C) File "???", line 0, in clone3 (libc.so.6)\n')
    first, second = parse_pystack(text, 12387)
    assert (first.os_thread_id, first.name, first.owns_gil, first.is_main) == (12387, None, True, True)
    assert [f.where(brief=True) for f in first.frames] == ["crash_here (<string>:3)"]
    assert second.os_thread_id == 12390 and not second.owns_gil and second.native_frames[0].name == "clone3"


def test_core_bt_with_pystack_alone(core_dir: Path, tmp_path: Path) -> None:
    """No gdb on PATH: `pystack core` alone gives the native and the Python frames."""
    pystack = find_program("pystack")
    require(pystack, "pystack")
    assert pystack is not None
    require(not os.path.exists(os.path.join(os.path.dirname(sys.executable), "gdb")), "no gdb beside python")
    (tmp_path / "pystack").symlink_to(pystack)
    proc = mldebug("core-bt", "--json", str(_core(core_dir)), env={"PATH": str(tmp_path)}, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (core,) = json.loads(proc.stdout)["result"]["cores"]
    assert core["ok"] and core["tool"] == "pystack", core["error"]
    assert "strlen" in core["crash_frame"], core["crash_frame"]
    _python_frames_of_crash(core)


def test_a_directory_is_searched_for_core_files_whatever_their_names(core_dir: Path, tmp_path: Path) -> None:
    require(shutil.which("gdb") or shutil.which("pystack"), "gdb or pystack")
    run = tmp_path / "run7"
    (run / "rank1").mkdir(parents=True)
    shutil.copy(_core(core_dir), run / "core.99")
    shutil.copy(_core(core_dir), run / "rank1" / "core.4242")
    (run / "core.txt").write_text("not a core")
    (run / "linked.core").symlink_to(_core(core_dir))  # links are not followed
    (run / "elsewhere").symlink_to(core_dir)
    proc = mldebug("core-bt", "--json", str(run), "--newest", "20", timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)["result"]
    assert sorted(c["path"] for c in result["cores"]) == [str(run / "core.99"), str(run / "rank1" / "core.4242")]
    assert result["searched"] == [str(run / "**")]
    one = mldebug("core-bt", "--json", "--dir", str(run / "rank1"), timeout=180)
    assert [c["path"] for c in json.loads(one.stdout)["result"]["cores"]] == [str(run / "rank1" / "core.4242")]


def _dac_ignored() -> list[str]:
    """A prefix that makes root obey a directory's mode bits (CAP_DAC_* dropped), as other users do."""
    if os.geteuid() != 0:
        return []
    drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    require(shutil.which("setpriv") and subprocess.run([*drop, "true"]).returncode == 0,
            "setpriv able to drop CAP_DAC_OVERRIDE (to make a directory unreadable to root)")
    return drop


def test_an_unreadable_directory_is_reported(tmp_path: Path) -> None:
    prefix = _dac_ignored()
    locked = tmp_path / "run" / "rank0"
    locked.mkdir(parents=True)
    locked.chmod(0)
    try:
        def core_bt(d: Path) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*prefix, sys.executable, "-m", "ml_debug", "core-bt", "--json", str(d)],
                                  capture_output=True, text=True, cwd=REPO, timeout=60)
        inside = core_bt(tmp_path / "run")
        assert inside.returncode == 0, inside.stderr
        assert f"could not read directory {locked}: Permission denied" in json.loads(inside.stdout)["result"]["notes"]
        named = core_bt(locked)
        assert named.returncode == 2 and f"cannot read directory {locked}" in named.stderr, named.stderr
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("args, message", [
    (["--dir", "/nonexistent"], "--dir /nonexistent does not exist"),
    (["--exe", "/nonexistent"], "--exe '/nonexistent' does not exist"),
    (["--exe", "/tmp"], "--exe '/tmp' is not an executable file"),
    (["/dev/null"], "/dev/null is a character device"),
    ([""], "an empty path was given"),
])
def test_bad_paths_are_usage_errors(args: list[str], message: str) -> None:
    proc = mldebug("core-bt", *args, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("mldebug: error: ") and message in proc.stderr, proc.stderr
    assert "hint: " in proc.stderr


def test_a_truncated_core_is_not_fully_read(core_dir: Path, tmp_path: Path) -> None:
    require(shutil.which("gdb") or shutil.which("pystack"), "gdb or pystack")
    whole = _core(core_dir)
    half = tmp_path / "core.half"
    half.write_bytes(whole.read_bytes()[:whole.stat().st_size // 2])
    proc = mldebug("core-bt", "--json", str(half), timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)["result"]
    (core,) = result["cores"]
    assert not core["ok"] and core["error"].startswith(f"core file truncated: {half.stat().st_size} of the "), core
    assert "not fully read" in result["summary"]
    human = mldebug("core-bt", str(half), timeout=120)
    assert human.returncode == 4 and f"not fully read: {half}: core file truncated" in human.stdout


def _gdb_or_pystack_of(pid: int) -> list[int]:
    """Live gdb/pystack processes reading a core through mldebug `pid`'s descriptor (/proc/PID/fd/N)."""
    needle = f"/proc/{pid}/fd/".encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and needle in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("fmt, sigints", [("--json", 1), ("--json", 2), ("text", 2)])
def test_ctrl_c_while_reading_cores_shows_those_read(core_dir: Path, tmp_path: Path, fmt: str, sigints: int) -> None:
    """Ctrl-C after the first of 6 cores is read: exit 130 and the cores read are the report (stdout was
    empty). Two SIGINTs 10 ms apart, as `timeout -s INT` sends them (the process, then its group): the
    second must not lose the report either; and gdb/pystack do not outlive mldebug."""
    import signal
    import time

    require(shutil.which("gdb") or shutil.which("pystack"), "gdb or pystack")
    many = tmp_path / "many"
    many.mkdir()
    for i in range(6):
        shutil.copy(_core(core_dir), many / f"core.{i}")  # copies: one file linked six times is one core
    args = ["--json"] if fmt == "--json" else []
    proc = subprocess.Popen([sys.executable, "-m", "ml_debug", "core-bt", *args, str(many)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True,
                            env={**os.environ, "MLDEBUG_WIDTH": "160"})
    try:
        assert proc.stderr is not None
        err = stderr_until(proc, "core-bt: core 1/6 read: ", "one core read, the next being read")
        proc.send_signal(signal.SIGINT)
        if sigints == 2:
            time.sleep(0.01)  # the gap `timeout` leaves between the two, not a synchronisation
            os.killpg(proc.pid, signal.SIGINT)
        stdout, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err += rest
    assert proc.returncode == 130, err
    assert "mldebug: error: interrupted" in err and "Traceback" not in err, err
    left = _gdb_or_pystack_of(proc.pid)
    assert left == [], f"gdb/pystack still running after mldebug exited: {left}"
    if fmt == "--json":
        doc = json.loads(stdout)
        jsonschema.validate(doc, SCHEMA)
        result = doc["result"]
        read = len(result["cores"])
        assert 1 <= read < 6 and result["interrupted"] and result["exit_code"] == 130 and not result["ok"], result
        assert result["groups"][0]["count"] == read
        assert f"interrupted (Ctrl-C) after {read} of 6 cores: those read are shown" in result["notes"]
        assert result["summary"].endswith(f"(interrupted after {read} of 6 cores read)"), result["summary"]
    else:
        assert "group A: " in stdout and "crash_here (<string>:3)" in stdout, stdout
        assert "note: interrupted (Ctrl-C) after " in stdout and " of 6 cores read)" in stdout, stdout


def test_a_cut_core_says_the_tools_errors_about_the_file_given(core_dir: Path, tmp_path: Path) -> None:
    """A core cut to 100 bytes: pystack's error is its traceback's last line (`RuntimeError: ...`), not a
    `File ...` frame of it, and gdb's names the file given, not mldebug's /proc/PID/fd/N."""
    require(find_program("gdb") and find_program("pystack"), "gdb and pystack")
    cut = tmp_path / "core.100"
    cut.write_bytes(_core(core_dir).read_bytes()[:100])
    proc = mldebug("core-bt", "--json", str(cut), timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    (core,) = json.loads(proc.stdout)["result"]["cores"]
    gdb, pystack = core["error"].split("; ")[:2]
    assert gdb.startswith("gdb: ") and str(cut) in gdb, core["error"]
    assert pystack.startswith("pystack: RuntimeError: ") and str(cut) in pystack, core["error"]
    assert "/proc/" not in core["error"] and 'File "' not in core["error"], core["error"]


def test_ctrl_c_as_a_tool_ends_keeps_the_cores_read(core_dir: Path, tmp_path: Path) -> None:
    """Ctrl-C in the instant the tool reading the 2nd core had ended and been reaped: stopping its process
    group found none (`internal error: ProcessLookupError`) and the core already read was lost. Now: exit 130,
    the first core in the document. (tests/fakes/signal_at_start.py makes that instant happen.)"""
    from tests.fakes import signal_at_start

    require(shutil.which("gdb"), "gdb")
    two = tmp_path / "two"
    two.mkdir()
    for i in range(2):
        shutil.copy(_core(core_dir), two / f"core.{i}")
    tool = "gdb"
    proc = subprocess.run([sys.executable, "-m", "ml_debug", "core-bt", "--json", str(two)], capture_output=True,
                          text=True, cwd=REPO, timeout=120,
                          env={**os.environ, **signal_at_start.env("SIGINT", tool, tmp_path / "pids", skip=1,
                                                                   gone=True)})
    assert proc.returncode == 130, proc.stderr
    assert "internal error" not in proc.stderr and "mldebug: error: interrupted" in proc.stderr, proc.stderr
    result = json.loads(proc.stdout)["result"]
    assert result["interrupted"] and len(result["cores"]) == 1 and result["cores"][0]["ok"], result["summary"]
