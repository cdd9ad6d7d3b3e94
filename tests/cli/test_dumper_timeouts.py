"""dump-stacks against a process no dumper can attach to: `--attach-timeout` and `--gdb-timeout` stop the
dumper, the next one in the chain is tried, and the reason names the limit to raise.

The target is real: a Python process blocked in vfork(2) while its child never execs. The kernel
keeps it in state D (a killable wait), where ptrace's stop never arrives, so a blocking py-spy and
gdb wait forever, exactly as they do on a rank stuck in uninterruptible I/O. `py-spy --nonblocking`
reads its memory without stopping it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import REPO, kill_pids, mldebug, py_spy, require, wait_until

SCHEMA = json.loads((REPO / "ml_debug" / "schemas" / "dump-stacks.json").read_text())
IN_VFORK = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)

def stuck_in_vfork():
    if libc.vfork() == 0:  # the child shares our memory and never execs: we wait in state D
        libc.pause()
        libc._exit(0)

print("ready", flush=True)
stuck_in_vfork()
"""


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


@pytest.fixture
def unattachable() -> Iterator[int]:
    """Pid of a Python process in state D (see the module docstring)."""
    require(py_spy(), "py-spy")
    proc = subprocess.Popen([sys.executable, "-c", IN_VFORK], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        wait_until(lambda: _state(proc.pid) == "D", 30, "the process to wait in vfork (state D)")
        yield proc.pid
    finally:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        kids = [int(c) for c in children.read_text().split()] if children.exists() else []
        kill_pids([*kids, proc.pid])  # the wait is killable
        proc.wait(timeout=30)
        for kid in kids:
            wait_until(lambda k=kid: _state(k) in (None, "Z"), 10, f"child {kid} to end")


def _result(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.stdout.strip(), proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, SCHEMA)
    return doc["result"]


def test_a_hanging_py_spy_is_stopped_at_timeout_and_the_nonblocking_retry_reads_the_stack(unattachable: int) -> None:
    proc = mldebug("dump-stacks", "--pid", str(unattachable), "--attach-timeout", "1", "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr  # one process, dumped: nothing odd to name
    result = _result(proc)
    (p,) = result["processes"]
    sample = p["samples"][0]
    attempts = [(a["dumper"], a["ok"], a["error"]) for a in sample["attempts"]]
    assert attempts == [("py-spy", False, "timed out after 1 s"), ("py-spy --nonblocking", True, None)], attempts
    assert sample["dumper"] == "py-spy --nonblocking"
    main = [t for t in sample["threads"] if t["is_main"]][0]
    assert main["frames"][0]["name"] == "stuck_in_vfork"
    assert _state(unattachable) == "D"  # left as it was, not stopped by us


def test_a_hanging_gdb_is_stopped_at_gdb_timeout_and_named(unattachable: int) -> None:
    require(subprocess.run(["gdb", "--version"], capture_output=True).returncode == 0, "gdb")
    proc = mldebug("dump-stacks", "--pid", str(unattachable), "--dumper", "gdb", "--gdb-timeout", "2", "--json",
                   timeout=120)
    assert proc.returncode == 3, proc.stderr  # nothing could be dumped
    result = _result(proc)
    (entry,) = result["not_dumped"]
    assert entry["pid"] == unattachable
    # the limit the user set, and the option that raises it (gdb ignores SIGTERM while it attaches,
    # so it is killed a little later: that grace is not the limit)
    assert entry["error"] == "timed out after 2 s", entry
    assert entry["fix"].startswith("raise --gdb-timeout"), entry
    assert "hint: raise --gdb-timeout" in proc.stderr
    assert _state(unattachable) == "D"
    # no gdb left behind
    leftover = [int(p) for p in subprocess.run(["pgrep", "-f", f"gdb .*-p {unattachable}"], capture_output=True,
                                                text=True).stdout.split()]
    assert leftover == [], leftover
