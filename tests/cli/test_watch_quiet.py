"""What `mldebug watch` says when it ends without an incident: it vouches for progress only where it saw
some. (A `sleep` watched for 3 s inside the 60 s --grace was reported as "1 rank(s) ... made progress".)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import mldebug, stderr_until


@pytest.fixture
def idle_process():  # type: ignore[no-untyped-def]
    proc = subprocess.Popen(["sleep", "300"])
    yield proc.pid
    proc.kill()
    proc.wait(timeout=30)


def _summary(*args: str) -> str:
    proc = mldebug("--json", "watch", *args, "--interval", "1", "--stack-every", "0", timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["result"]["summary"]


def test_inside_the_grace_no_rank_is_vouched_for(idle_process: int) -> None:
    summary = _summary("--pid", str(idle_process), "--duration", "2")
    assert summary.startswith("no verdict: 1 rank(s) on 1 node(s) watched for "), summary
    assert "inside the first 60 s (--grace), when no rank is judged" in summary and "progress" not in summary


def test_a_rank_that_never_moved_is_named_not_called_progressing(idle_process: int) -> None:
    summary = _summary("--pid", str(idle_process), "--duration", "3", "--grace", "0", "--stall", "60")
    assert summary.startswith("no incident in "), summary
    assert "but 1 showed no progress yet (" in summary and f"pid {idle_process}" in summary, summary
    assert summary.endswith("for less than --stall 60 s") and "made progress" not in summary


def test_sigterm_is_said_as_terminated_not_interrupted(idle_process: int) -> None:
    """scancel and kill send SIGTERM: watch said "watch: interrupted" and the error "interrupted", as for a
    Ctrl-C. Now it says which signal ended it; the exit code stays 130."""
    proc = subprocess.Popen([sys.executable, "-m", "ml_debug", "watch", "--pid", str(idle_process), "--interval", "1",
                             "--stack-every", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    err = stderr_until(proc, f"watch: watching pid {idle_process}", "watch to start watching")
    proc.send_signal(signal.SIGTERM)
    out, rest = proc.communicate(timeout=60)
    err += rest
    assert proc.returncode == 130, err
    assert "watch: terminated (SIGTERM)" in err and "watch: interrupted" not in err, err
    assert "mldebug: error: interrupted by SIGTERM" in err, err
