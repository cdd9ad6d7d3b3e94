"""Nothing left behind: ranks die with their launcher, even a SIGKILLed one; SIGTERM ends every command like
Ctrl-C (exit 130, the signal named, one JSON document with --json); `mldebug launch` stopped by SIGTERM stops
torchrun and its ranks and records its end in launch.json. Every process is found by a marker in its
environment, never by name."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from tests.conftest import pids_with_env, validate_schema, wait_until
from tests.fakes import faults, pythonpath

MARKER = "MLDEBUG_LIFECYCLE_TEST"


def _start(args: list[str], token: str, extra: dict[str, str] | None = None, cwd: Path | None = None
           ) -> subprocess.Popen[str]:
    env = {**os.environ, MARKER: token, "OMP_NUM_THREADS": "1", **(extra or {})}
    env["PYTHONPATH"] = pythonpath(env)
    return subprocess.Popen([sys.executable, "-m", "ml_debug", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=cwd, stdin=subprocess.DEVNULL)


def _ranks(token: str, launcher: int) -> list[int]:
    return [p for p in pids_with_env(MARKER, token) if p != launcher]


def _kill_all(token: str) -> None:
    for pid in pids_with_env(MARKER, token):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _hung_gpu_test(token: str) -> subprocess.Popen[str]:
    """A self-launched 2-rank gpu-test whose ranks stay in the all_reduce (its timeout is far away)."""
    hang = faults.env("gpu-test.hang:stage=all_reduce")
    return _start(["gpu-test", "--nproc-per-node", "2", "--device", "cpu", "--stage-timeout", "120", "--json"], token, hang)


def _both_ranks_started(proc: subprocess.Popen[str], token: str) -> list[int]:
    """Both ranks started (the launcher itself and two workers carry the marker)."""
    assert proc.poll() is None, proc.communicate()
    ranks = [p for p in _ranks(token, proc.pid) if b"ml_debug.cli.worker" in Path(f"/proc/{p}/cmdline").read_bytes()]
    return ranks if len(ranks) == 2 else []


def test_sigkill_or_sigterm_of_a_self_launcher_leaves_no_rank_alive() -> None:
    """Two hung 2-rank gpu-tests at once: the SIGKILLed one's ranks die with it (the kernel's parent-death
    signal: no handler runs); the SIGTERMed one ends like Ctrl-C: exit 130, the signal named, one JSON
    document (not "ranks did not finish", exit 4)."""
    killed, termed = uuid.uuid4().hex, uuid.uuid4().hex
    procs = {killed: _hung_gpu_test(killed), termed: _hung_gpu_test(termed)}
    try:
        for token, proc in procs.items():
            wait_until(lambda: _both_ranks_started(proc, token), 90, "the two ranks to start")  # noqa: B023
        procs[killed].kill()
        procs[termed].send_signal(signal.SIGTERM)
        out, err = procs[termed].communicate(timeout=90)
        assert procs[termed].returncode == 130, err
        assert "mldebug: error: interrupted by SIGTERM" in err and "did not finish within" not in err, err
        doc = json.loads(out)  # exactly one document
        validate_schema(doc, "error")
        assert doc["result"]["exit_code"] == 130 and doc["result"]["error"]["signal"] == "SIGTERM"
        if doc["result"]["partial"] is not None:  # rank 0 finished its verdict as it was stopped
            validate_schema(doc["result"]["partial"], "gpu-test")
        for token in procs:
            wait_until(lambda: not pids_with_env(MARKER, token), 30, "the ranks to be gone")  # noqa: B023
    finally:
        for token, proc in procs.items():
            _kill_all(token)
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


SLEEPER = "import time\nprint('rank up', flush=True)\ntime.sleep(600)\n"


def _left(token: str) -> str:
    """The processes of the job marked ``token`` still there: pid, state, parent and command line."""
    import psutil

    out = []
    for pid in pids_with_env(MARKER, token):
        try:
            p = psutil.Process(pid)
            out.append(f"{pid} {p.status()} ppid {p.ppid()}: {' '.join(p.cmdline())[:200]}")
        except psutil.Error:
            continue
    return "; ".join(out) or "none"


def test_sigterm_and_sigkill_of_mldebug_launch_leave_no_rank_alive(tmp_path: Path) -> None:
    """SIGTERM: torchrun and its ranks stopped, launch.json says when and how it ended (130). SIGKILL (no
    handler runs): torchrun gets SIGTERM from the kernel, once, and stops its ranks."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    procs: dict[signal.Signals, tuple[str, Path, subprocess.Popen[str]]] = {}
    for sig in (signal.SIGTERM, signal.SIGKILL):  # both at once: the suite waits for one torchrun start
        token, logs = uuid.uuid4().hex, tmp_path / f"logs-{sig.name}"
        procs[sig] = token, logs, _start(["launch", "--nproc-per-node", "2", "--log-dir", str(logs), "--", "python",
                                          "sleeper.py"], token, cwd=tmp_path)
    try:
        for _, logs, _ in procs.values():
            wait_until(lambda: (c := next(iter(logs.glob("*/console.log")), None)) is not None  # noqa: B023
                       and c.read_text().count("rank up") == 2, 90, "both ranks to start")
        for _, _, proc in procs.values():
            # one thread: the kernel sends torchrun its parent-death SIGTERM once per thread of a killed parent,
            # and a second one inside torchrun's shutdown leaves it hanging at exit (lifecycle.py)
            assert os.listdir(f"/proc/{proc.pid}/task") == [str(proc.pid)]
        for sig, (_, _, proc) in procs.items():
            proc.send_signal(sig)
        for sig, (token, logs, proc) in procs.items():
            _, err = proc.communicate(timeout=60)
            # torchrun gives a rank 30 s after its SIGTERM before it kills it: past that, what is left is named
            wait_until(lambda: not pids_with_env(MARKER, token), 75,  # noqa: B023
                       f"torchrun and its ranks to stop after {sig.name}",
                       why=lambda: _left(token))  # noqa: B023
            if sig == signal.SIGTERM:
                assert proc.returncode == 130, err
                assert "mldebug: error: interrupted by SIGTERM" in err, err
                manifest = json.loads(next(iter(logs.glob("*/launch.json"))).read_text())
                assert manifest["ended"] and manifest["exit_code"] == 130 and manifest["signal"] == "SIGTERM", manifest
                assert "stopped by the user" not in err, err  # its closing verdict: a stop from outside
    finally:
        for token, _, proc in procs.values():
            _kill_all(token)
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


CHATTY = ("import time\nfor i in range(200):\n    print(f'line {i} ' + 'x' * 1000, flush=True)\n"
          "print('all printed', flush=True)\ntime.sleep(600)\n")


def test_a_terminal_that_takes_nothing_neither_cuts_console_log_nor_holds_the_stop(tmp_path: Path) -> None:
    """`mldebug launch ... | less`, the pager never read: 400 KiB of the job's output fill the pipe, and console.log
    still gets every line; SIGTERM still stops the job at once (launch copies torchrun's output from its one thread,
    which never waits on the terminal), and stderr says what the terminal did not take."""
    (tmp_path / "chatty.py").write_text(CHATTY)
    token, logs = uuid.uuid4().hex, tmp_path / "logs"
    with open(tmp_path / "stderr", "w") as err:
        env = {**os.environ, MARKER: token, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath(os.environ)}
        proc = subprocess.Popen([sys.executable, "-m", "ml_debug", "launch", "--nproc-per-node", "2", "--log-dir",
                                 str(logs), "--", "python", "chatty.py"], stdout=subprocess.PIPE, stderr=err, env=env,
                                cwd=tmp_path, stdin=subprocess.DEVNULL)
        try:
            console = lambda: next(iter(logs.glob("*/console.log")), tmp_path / "none")  # noqa: E731
            wait_until(lambda: console().is_file() and console().read_text().count("all printed") == 2, 120,
                       "both ranks' 200 lines in console.log while nobody reads the terminal")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 130
        finally:
            _kill_all(token)
            if proc.poll() is None:
                proc.kill()
            assert proc.stdout is not None
            proc.stdout.close()
            proc.wait()
    text = console().read_text()
    assert all(f"rank{r}]:line {i} " in text for r in (0, 1) for i in range(200))
    said = (tmp_path / "stderr").read_text()
    assert "mldebug: error: interrupted by SIGTERM" in said, said
    assert "mldebug launch: the terminal did not take " in said and "console.log has all of it" in said, said
    wait_until(lambda: not pids_with_env(MARKER, token), 60, "torchrun and its ranks to stop", why=lambda: _left(token))
