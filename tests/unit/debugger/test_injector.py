"""The injector's gdb command line keeps the interrupted system call (orig_rax) around gdb's calls, and the lldb it
falls back to is the newest lldb-NN on PATH (tests/cli/test_attach.py injects with both on real processes)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from ml_debug.core.extras import find_lldb
from ml_debug.debugger.injector.__main__ import keeping_the_system_call


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

