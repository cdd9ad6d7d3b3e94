"""The injector's gdb command line keeps the interrupted system call (orig_rax) around gdb's calls, and the lldb it
falls back to is the newest lldb-NN on PATH, and a call lldb could not make is said (tests/cli/test_attach.py injects
with both on real processes)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from ml_debug.core.extras import find_lldb
from ml_debug.debugger.injector.__main__ import (
    LldbFailed,
    inject_with_lldb,
    keeping_the_system_call,
    lldb_argv,
)


def test_orig_rax_is_kept_before_the_first_call_and_put_back_after_the_last() -> None:
    cmd = ("gdb --nw --pid 42 --batch --eval-command='set scheduler-locking off' "
           "--eval-command='call (void*)dlopen(\"/x.so\", 2)' --eval-command='call (int)DoAttach(0, \"code\", 0)'")
    got = keeping_the_system_call(cmd)
    if platform.machine() != "x86_64":
        assert got == cmd
        return
    keep, put_back = "--eval-command='set $mldebug_orig_rax = $orig_rax'", "--eval-command='set $orig_rax = $mldebug_orig_rax'"
    assert got.index("scheduler-locking") < got.index(keep) < got.index("dlopen") < got.index("DoAttach")
    assert got.endswith(" " + put_back) and got.replace(keep + " ", "").replace(" " + put_back, "") == cmd
    assert keeping_the_system_call("gdb --batch -ex 'bt'") == "gdb --batch -ex 'bt'"  # no call: nothing to keep


def test_the_newest_lldb_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d, names in ((a, ["lldb-15", "lldb-server-19", "lldb"]), (b, ["lldb-19", "lldb-instr-19"])):
        d.mkdir()
        for n in names:
            (d / n).write_text("#!/bin/sh\n")
            (d / n).chmod(0o755)
    monkeypatch.setenv("PATH", f"{a}{os.pathsep}{tmp_path / 'gone'}{os.pathsep}{b}")
    assert find_lldb() == str(b / "lldb-19")
    monkeypatch.setenv("PATH", str(a / "none"))
    assert find_lldb() is None



def test_lldb_argv_is_a_list_and_refuses_what_would_break_its_quoting() -> None:
    argv = lldb_argv("lldb-19", 42, "/x/attach.so", "exec(bytes([1]).decode(), dict())")
    assert argv[:2] == ["lldb-19", "--no-lldbinit"] and "process attach --pid 42" in argv
    assert 'mldebug_call "/x/attach.so" "exec(bytes([1]).decode(), dict())"' in argv
    assert argv[argv.index("process detach") - 4].startswith('command script import "/')
    for bad in ('/x/a"b.so', "/x/a\\b.so"):
        with pytest.raises(LldbFailed, match="quote or a backslash"):
            lldb_argv("lldb-19", 42, bad, "1")


def test_a_call_lldb_could_not_make_is_said_and_the_process_runs_on(tmp_path: Path) -> None:
    """A real lldb on a real sleeping process, given a library that does not exist: the injector is told why
    (lldb itself exits 0 either way), and the process is left running, untouched."""
    from tests.conftest import require, wait_until

    lldb = find_lldb()
    require(lldb, "lldb (tests/rig/up.sh installs lldb-19)")
    assert lldb is not None
    ticks = tmp_path / "ticks"
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time\nwhile True:\n    open(sys.argv[1], 'a').write('.')"
                             "\n    time.sleep(0.05)", str(ticks)])
    try:
        wait_until(ticks.exists, 30, "the sleeper to start")
        with pytest.raises(LldbFailed, match="load dlopen returned NULL"):
            inject_with_lldb(lldb, proc.pid, str(tmp_path / "missing.so"), "print(1)")
        before = ticks.stat().st_size
        wait_until(lambda: ticks.stat().st_size > before, 30, "the sleeper to go on after lldb detached")
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=10)
