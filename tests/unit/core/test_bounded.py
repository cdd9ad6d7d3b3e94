"""core/bounded: a helper command with a time limit that holds for its whole process group (real
processes: a wrapper shell whose child would otherwise outlive the limit)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ml_debug.core import bounded
from tests.conftest import wait_until


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_it_returns_the_output_and_status_like_subprocess_run() -> None:
    done = bounded.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    assert bounded.run(["sh", "-c", 'printf %s "$WORD"'], timeout=30, env={"WORD": "given"}).stdout == "given"
    assert bounded.run(["sh", "-c", "read x || echo eof"], timeout=30).stdout == "eof\n"  # stdin is /dev/null


def test_at_the_limit_the_wrappers_children_die_too(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    # a wrapper whose child holds stdout open: subprocess.run's timeout would wait for the child
    script = f"sleep 300 & echo $! > {pidfile}; wait"
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        bounded.run(["sh", "-c", script], timeout=1.0)
    assert time.monotonic() - t0 < 20
    child = int(wait_until(lambda: pidfile.read_text().strip() if pidfile.exists() else "", 10, "the child's pid"))
    wait_until(lambda: not _alive(child), 10, "the wrapper's child to be killed with its group")
    assert bounded._live == set()


def test_kill_all_stops_a_command_another_thread_runs(tmp_path: Path) -> None:
    got: list[subprocess.CompletedProcess[str]] = []
    worker = threading.Thread(target=lambda: got.append(bounded.run(["sleep", "300"], timeout=300)), daemon=True)
    worker.start()
    wait_until(lambda: bounded._live, 10, "the command to start")
    (pgid,) = bounded._live
    assert os.getpgid(pgid) == pgid  # a process group of its own: nothing else in it is ours
    bounded.kill_all()
    worker.join(timeout=20)
    assert not worker.is_alive() and got[0].returncode == -9
    assert bounded._live == set()
