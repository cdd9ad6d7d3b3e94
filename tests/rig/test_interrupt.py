"""Ctrl-C: every command that starts ranks or reaches nodes exits 130 and leaves no process behind.

A terminal's Ctrl-C sends SIGINT to its foreground process group: here the mldebug process is
started in a group of its own and the group gets SIGINT, once the work is really under way (ranks
started and blocked, a node's agent running). torchrun-style ranks live in sessions of their own,
so a terminal never reaches them: mldebug must stop them. Every process a test starts carries
MLDEBUG_TEST_JOB=<token> in its environment (ranks inherit it; a node's agent gets it through
--remote-prefix), which is how leftovers are found, here and on the rig's nodes. (`mldebug train`'s Ctrl-C: on the hung job
of tests/cli/test_watch.py's hung-rank test, which is already running when that test ends.)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import (
    REPO,
    kill_pids,
    main_thread_functions,
    pids_with_env,
    require,
    wait_in_function,
    wait_until,
)
from tests.fakes import faults

TOKEN_VAR = "MLDEBUG_TEST_JOB"
VENV_PYTHON = str(REPO / ".venv" / "bin" / "python")


@dataclass
class Run:
    proc: subprocess.Popen[bytes]
    token: str
    stderr: Path
    stdout: Path

    def processes(self) -> list[int]:
        """Every live process of this run (mldebug, its ranks, their children, remote agents)."""
        return pids_with_env(TOKEN_VAR, self.token)

    def ranks(self) -> dict[int, int]:
        """rank -> pid of the worker processes mldebug started (RANK in their environment)."""
        out = {}
        for pid in self.processes():
            try:
                env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text(errors="replace")
                           .split("\0") if "=" in kv)
            except OSError:
                continue
            if "RANK" in env and pid != self.proc.pid:
                out[int(env["RANK"])] = pid
        return out

    def ctrl_c(self) -> None:
        """Ctrl-C as `timeout -s INT` gives it: SIGINT to mldebug, and to its process group 10 ms later
        (a second SIGINT, while the first is being answered, printed a traceback at exit)."""
        assert self.proc.poll() is None, f"mldebug ended before Ctrl-C:\n{self.stderr.read_text()[-3000:]}"
        self.proc.send_signal(signal.SIGINT)
        time.sleep(0.01)  # the gap `timeout` leaves, not a synchronisation
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)


@pytest.fixture
def start(tmp_path: Path) -> Iterator:
    """start(*mldebug_args, env=...) -> Run; afterwards every process of every run is killed."""
    runs: list[Run] = []

    def _start(*args: str, env: dict[str, str] | None = None) -> Run:
        token = uuid.uuid4().hex[:12]
        err, out = tmp_path / f"stderr-{token}", tmp_path / f"stdout-{token}"
        full = {**os.environ, "OMP_NUM_THREADS": "1", "MLDEBUG_WIDTH": "160", **(env or {}), TOKEN_VAR: token}
        for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
            full.pop(var, None)
        with open(err, "wb") as f, open(out, "wb") as o:
            proc = subprocess.Popen([sys.executable, "-m", "ml_debug", *args], stdin=subprocess.DEVNULL,
                                    stdout=o, stderr=f, env=full, cwd=tmp_path, start_new_session=True)
        runs.append(Run(proc, token, err, out))
        return runs[-1]

    yield _start
    for run in runs:
        kill_pids([run.proc.pid, *run.processes()])
        run.proc.wait(timeout=30)


def _interrupted_cleanly(run: Run, keep: tuple[int, ...] = ()) -> None:
    """mldebug exits 130 without a traceback, and none of its processes outlives it."""
    try:
        rc = run.proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"mldebug still running 90 s after Ctrl-C:\n{run.stderr.read_text()[-3000:]}")
    err = run.stderr.read_text()
    assert rc == 130, err[-3000:]
    assert "mldebug: error: interrupted" in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "torch/distributed/elastic" not in err, err[-3000:]  # the launcher's own log stays quiet
    # SIGKILLed ranks vanish once reaped: a short grace, never a hang
    left = lambda: [p for p in run.processes() if p not in keep]  # noqa: E731
    if left():
        wait_until(lambda: not left(), 20, f"every process of the run to be gone (left: {left()})")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _two_ranks(run: Run) -> dict[int, int]:
    def both() -> dict[int, int] | None:
        ranks = run.ranks()
        return ranks if sorted(ranks) == [0, 1] else None

    return wait_until(both, 120, "both ranks to start")


def test_gpu_test_self_launched(start) -> None:  # type: ignore[no-untyped-def]
    run = start("gpu-test", "--nproc-per-node", "2", "--device", "cpu", "--backend", "gloo", "--stage-timeout", "600",
                env=faults.env("gpu-test.hang:rank=1,stage=all_reduce"))
    ranks = _two_ranks(run)
    wait_in_function(ranks[1], {"gpu_test_stage_start"}, timeout=120, innermost=False)  # rank 1 stalls
    run.ctrl_c()
    _interrupted_cleanly(run)


def test_allreduce_bench_self_launched(start) -> None:  # type: ignore[no-untyped-def]
    run = start("allreduce-bench", "--nproc-per-node", "2", "--backend", "gloo", "-b", "64K", "-e", "64K",
                "-n", "5", "-w", "1", "--collective-timeout", "600",
                env=faults.env("allreduce-bench.slow:rank=1,factor=1000000"))
    ranks = _two_ranks(run)
    wait_in_function(ranks[1], {"bench_timed_region"}, timeout=120, innermost=False)  # rank 1 in its timed batch
    run.ctrl_c()
    _interrupted_cleanly(run)


@pytest.mark.rig
def test_dump_stacks_over_ssh(start, rig_ssh, rig_nodes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    require(Path(VENV_PYTHON).exists(), f"the venv's python at {VENV_PYTHON}")
    node = rig_nodes[0]
    token = uuid.uuid4().hex[:12]
    # something to dump on the node: a Python process whose command line names this test
    target = subprocess.Popen(node.nsenter_argv([sys.executable, "-c", f"import time  # {token}\ntime.sleep(600)"]),
                              env={**os.environ, TOKEN_VAR: f"target-{token}"}, stdin=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        wait_until(lambda: pids_with_env(TOKEN_VAR, f"target-{token}"), 30, "the target to start on the node")
        hostfile = rig_ssh.hostfile([h for h in rig_ssh.nodes if h.name == node.name])
        # many slow samples: the node's agent is still at work when Ctrl-C comes
        run = start("dump-stacks", "--hosts", str(hostfile), "--ssh-config", str(rig_ssh.ssh_config),
                    "--remote-python", VENV_PYTHON, "--remote-prefix", f"export {TOKEN_VAR}=agent-{token}",
                    "--pattern", token, "--samples", "2", "--interval", "300", "--json")

        def agent() -> list[int]:
            return [p for p in pids_with_env(TOKEN_VAR, f"agent-{token}") if b"dump-stacks" in _cmdline(p)]

        wait_until(lambda: agent() or run.proc.poll() is not None, 120, "the node's dump-stacks agent to start")
        assert agent(), run.stderr.read_text()[-3000:]

        seen = [0]

        def between_samples() -> bool:
            """Sample 1 taken, waiting for sample 2: `_sample` calls Event.wait (in a round it calls
            Future.result, or submit while a worker thread starts); twice in a row, so not stop.wait(0)."""
            stacks = [main_thread_functions(p) or [] for p in agent()]
            waiting = any("_sample" in s[1:] and s[s.index("_sample") - 1] == "Event.wait" for s in stacks)
            seen[0] = seen[0] + 1 if waiting else 0
            return seen[0] >= 2

        wait_until(between_samples, 60, "the agent to take its first sample", interval=0.1)
        run.ctrl_c()
        _interrupted_cleanly(run)
        # the sample the node took is in the report: the agent heard the Ctrl-C (its session closed) and
        # printed what it had (it was lost with the session)
        result = json.loads(run.stdout.read_text())["result"]
        assert result["interrupted"] is True and result["exit_code"] == 130, result["summary"]
        assert [len(p["samples"]) for p in result["processes"]] == [1], (result["nodes"], run.stderr.read_text())
        assert result["processes"][0]["host"] == node.name
        # and on the node: the agent (and whatever it started) is gone too, not left to its deadline
        if agent():
            wait_until(lambda: not agent(), 20, f"the agent on {node.name} to stop (left: {agent()})")
        assert pids_with_env(TOKEN_VAR, f"agent-{token}") == []
    finally:
        kill_pids([*pids_with_env(TOKEN_VAR, f"agent-{token}"), *pids_with_env(TOKEN_VAR, f"target-{token}")])
        target.kill()
        target.wait(timeout=30)


@pytest.mark.rig
def test_exec_over_ssh_stops_the_remote_command_and_its_children(start, rig_ssh) -> None:  # type: ignore[no-untyped-def]
    """A command that never writes (no broken pipe to stop it) and has a child, on a loopback host and a
    netns node: Ctrl-C here ends it there at once, not at its deadline (--node-timeout + 6 s)."""
    seconds = f"900.{uuid.uuid4().int % 10**9:09d}"  # names this test's remote processes
    hostfile = rig_ssh.hostfile([rig_ssh.hosts[0], rig_ssh.nodes[0]])
    run = start("exec", "--hosts", str(hostfile), "--ssh-config", str(rig_ssh.ssh_config), "--node-timeout", "600", "--",
                "sh", "-c", f"sleep {seconds} & sleep {seconds}; wait")

    def remote() -> list[int]:  # the rig's hosts share this machine's /proc (netns nodes: their own pid namespace)
        return [int(p.name) for p in Path("/proc").iterdir()
                if p.name.isdigit() and _cmdline(int(p.name)) == f"sleep\0{seconds}\0".encode()]

    try:
        wait_until(lambda: len(remote()) == 4, 60, "the command and its child to run on both hosts")
        run.ctrl_c()
        _interrupted_cleanly(run)
        if remote():
            wait_until(lambda: not remote(), 10, f"the remote commands to stop (left: {remote()})")
    finally:
        kill_pids(remote())


@pytest.mark.rig
@pytest.mark.parametrize("where", ["ssh", "local"])
def test_exec_ctrl_c_keeps_what_each_node_printed(start, rig_ssh, tmp_path: Path, where: str) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C ends the command on every node, and the report (here --json) still holds what each one
    printed until then, marked `interrupted`, exit 130. It printed nothing at all (--json, --group, --local)."""

    marks = tmp_path / "marks"
    marks.mkdir()
    hosts = ["--local"] if where == "local" else \
        ["--hosts", f"{rig_ssh.hosts[0].name},{rig_ssh.hosts[1].name}", "--ssh-config", str(rig_ssh.ssh_config)]
    seconds = f"900.{uuid.uuid4().int % 10**9:09d}"
    run = start("--json", "exec", *hosts, "--node-timeout", "600", "--",
                "sh", "-c", f'echo "out of $0"; echo "err of $0" >&2; mktemp -p {marks} >/dev/null; sleep {seconds}', "x")
    wait_until(lambda: len(list(marks.iterdir())) == (1 if where == "local" else 2), 60, "every node to print")
    run.ctrl_c()
    _interrupted_cleanly(run)
    result = json.loads(run.stdout.read_text())["result"]
    assert not result["ok"] and result["counts"]["interrupted"] == len(result["nodes"]) >= 1, result
    for node in result["nodes"]:
        assert node["failure"] == "interrupted" and node["detail"].startswith("stopped by Ctrl-C"), node
        assert node["stdout"] == "out of x\n" and node["stderr"].endswith("err of x\n"), node
    left = lambda: [p for p in Path("/proc").iterdir()  # noqa: E731
                    if p.name.isdigit() and _cmdline(int(p.name)) == f"sleep\0{seconds}\0".encode()]
    if left():
        wait_until(lambda: not left(), 10, "the commands to stop on every node")
