"""`mldebug attach --rank R` on a rank of another node: one value (--eval), and the prompt here with the
debugger on the rank's node (mldebug's DAP agent behind an ssh session or a Slurm step).

One looping 2-rank Slurm job on two rig nodes serves the module (rank 1 loops in Python, rank 0 waits in
all_reduce); its nodes also run sshd, so --hosts reaches the same ranks. After every attach the rank
still runs, and no agent, adapter, srun step or listening socket is left on either end.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_attach import _parts, processes_matching
from tests.conftest import main_thread_functions, mldebug, validate_schema, wait_until
from tests.rig.fixtures import HungJob

# every test counts the debugger processes of the whole machine (conftest.exclusive)
pytestmark = pytest.mark.usefixtures("debuggers_alone")

REMOTE = ["--remote-python", sys.executable]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[HungJob]:
    """The module's one hung job (tests/rig/fixtures.py starts it as its `hung_job` factory does)."""
    from tests.rig import fixtures

    _parts()
    first = len(fixtures._jobs)
    started = fixtures._Launch(tmp_path_factory.mktemp("attach-remote"), request)(
        nranks=2, odd_rank=1, odd_function="load_batch", mode="loop", where="slurm", nodes=2)
    assert started.job_id
    yield started
    try:
        started.kill()
    finally:
        del fixtures._jobs[first:]


def _leftovers(job: HungJob) -> list[str]:
    """Agents, adapters and srun steps of an attach still running, here or in the job's nodes."""
    return processes_matching(lambda cmd: "--dap-agent" in cmd or "debugpy" in cmd
                              or ("mldebug-attach" in cmd and "srun" in cmd))


def _listening(root_pid: int) -> set[str]:
    """The TCP listeners on the loopback of the network namespace `root_pid` lives in (a rig node's), and
    any socket of `root_pid` itself that listens. (Other tests' Slurm steps and gloo stores come and go
    on the node's own address: not counted.)"""
    own = set()
    for fd in Path(f"/proc/{root_pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            link = os.readlink(fd)
            if link.startswith("socket:["):
                own.add(link[8:-1])
    found = set()
    for name in ("tcp", "tcp6"):
        rows = Path(f"/proc/{root_pid}/net/{name}").read_text().splitlines()[1:]
        for row in rows:
            local, state, inode = row.split()[1], row.split()[3], row.split()[9]
            loopback = local.startswith(("0100007F:", "00000000000000000000000001000000:"))
            if state == "0A" and (loopback or inode in own):
                found.add(f"{name} {local}" + (" (the rank's own)" if inode in own else ""))
    return found


def _prompt(args: list[str], commands: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return mldebug("attach", *args, *REMOTE, input=commands, env=env, timeout=240)


def test_attach_to_a_rank_inside_a_slurm_job_and_over_ssh(job: HungJob, rig_ssh, rig_slurm) -> None:
    """Done means: `mldebug attach --slurm-job J --rank R --eval 'step'` prints rank R's value."""
    assert job.job_id
    via_slurm = mldebug("--json", "attach", "--slurm-job", job.job_id, "--rank", "1", "--eval", "step", *REMOTE,
                        env=rig_slurm.env, timeout=240)
    assert via_slurm.returncode == 0, via_slurm.stderr
    doc = json.loads(via_slurm.stdout)
    validate_schema(doc, "attach")
    r = doc["result"]
    host1, pid1 = job.ranks[1]
    assert (r["host"], r["pid"], r["rank"]) == (host1, pid1, 1)
    assert int(r["evaluation"]["value"]) > 0 and r["alive_after"]
    assert r["frames"][0]["name"] in ("load_batch", "stuck_here") and r["frames"][1]["name"] == "main"

    nodes = [n for n in rig_ssh.nodes if n.name in job.nodes]
    via_ssh = mldebug("attach", "--hosts", str(rig_ssh.hostfile(nodes)), "--ssh-config", str(rig_ssh.ssh_config),
                      "--env", f"MLDEBUG_RIG_JOB={job.token}", "--rank", "1", "--eval", "step", *REMOTE,
                      timeout=240)
    assert via_ssh.returncode == 0, via_ssh.stderr
    value = int(via_ssh.stdout.splitlines()[0].split(" step = ")[1])
    assert value > int(r["evaluation"]["value"])  # the loop went on between the two attaches
    assert via_ssh.stdout.splitlines()[0] == f"pid {pid1} (rank 1) on {host1}: step = {value}"

    # without --eval: the prompt's path, which finds the rank's node the same way
    wrong = mldebug("attach", "--slurm-job", job.job_id, "--rank", "7", *REMOTE, env=rig_slurm.env, input="quit\n",
                    timeout=240)
    assert wrong.returncode == 2, wrong.stderr
    assert "mldebug: error: rank 7 not found: " in wrong.stderr
    assert all(f"{h} runs {rank}" in wrong.stderr for rank, (h, _) in job.ranks.items()), wrong.stderr
    assert all(job.alive().values())


# The innermost frame is the loop's helper (no locals); `up` is main, whose `step` counts the loop.
COMMANDS = "bt\np time.__name__\nup\np step\np rank * 100 + world_size\nquit\n"


def _check_prompt(job: HungJob, proc: subprocess.CompletedProcess[str], listeners: set[str]) -> int:
    """The prompt's answers are the rank's values; the rank runs on; nothing is left; the step seen."""
    host1, pid1 = job.ranks[1]
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr + out
    assert out.startswith(f"attached to pid {pid1} (MainThread stopped in frame 0)"), out
    assert re.search(r"> #0  (load_batch|stuck_here)  hung_worker\.py:\d+\n  #1  main  hung_worker\.py:\d+\n", out), out
    assert "(mldebug) 'time'\n" in out, out
    assert re.search(r"\(mldebug\) > #1  main  hung_worker\.py:\d+\n", out), out
    step = re.search(r"\(mldebug\) (\d+)\n\(mldebug\) 102\n", out)  # rank 1 * 100 + world size 2
    assert step, out
    assert out.rstrip().endswith(f"detached: pid {pid1} still running"), out  # the node's own word
    root = job.root_pids[1]
    assert job.alive()[1]
    # unchanged: it loops (a sample may land in main between two calls of its helper: looked at until one does not)
    wait_until(lambda: (f := main_thread_functions(root)) and f[0] in ("load_batch", "stuck_here") and f[1] == "main",
               30, "rank 1 to go on with its loop", why=lambda: str(main_thread_functions(root)))
    wait_until(lambda: not _leftovers(job), 30, "the agent, the adapter and the srun step to end")
    assert _listening(root) == listeners  # nothing listens on the node's loopback, nor in the rank, that did not
    return int(step.group(1))


def test_the_prompt_here_on_a_rank_of_another_node_over_ssh_and_slurm(job: HungJob, rig_ssh, rig_slurm,
                                                                       tmp_path: Path) -> None:
    """`mldebug attach --hosts F --rank 1` and `--slurm-job J --rank 1`, driven through stdin; Ctrl-C at the
    ssh prompt, a mldebug killed at the Slurm prompt; then the bad input of this path: a node not reached,
    no debugpy on the rank's node."""
    assert job.job_id
    root = job.root_pids[1]
    listeners = _listening(root)
    nodes = [n for n in rig_ssh.nodes if n.name in job.nodes]
    hosts = ["--hosts", str(rig_ssh.hostfile(nodes)), "--ssh-config", str(rig_ssh.ssh_config),
             "--env", f"MLDEBUG_RIG_JOB={job.token}"]
    first = _check_prompt(job, _prompt([*hosts, "--rank", "1"], COMMANDS), listeners)
    _killed_client_leaves_nothing(job, hosts, listeners, sig=signal.SIGINT)
    then = _check_prompt(job, _prompt(["--slurm-job", job.job_id, "--rank", "1"], COMMANDS, env=rig_slurm.env),
                         listeners)
    assert then > first  # the loop ran on between the two prompts
    _killed_client_leaves_nothing(job, ["--slurm-job", job.job_id], listeners, rig_slurm.env)

    # bad input: one line each, with its exit code
    unreachable = tmp_path / "hosts"
    unreachable.write_text(f"{nodes[0].name}\n127.0.0.1 port=1\n")  # nothing listens on port 1
    no_debugpy = _venv_without_debugpy(tmp_path / "venv")
    cases = [  # (a rank on no node: in the test above)
        (["--hosts", str(unreachable), "--ssh-config", str(rig_ssh.ssh_config), "--env",
          f"MLDEBUG_RIG_JOB={job.token}", "--rank", "1"], 4, "; not reached: 127.0.0.1:1 (unreachable"),
    ]
    for args, code, words in cases:
        proc = _prompt(args, COMMANDS)
        assert proc.returncode == code, (args, proc.stderr)
        first_line = proc.stderr.splitlines()[0]
        assert first_line.startswith("mldebug: error: ") and words in first_line, proc.stderr
    proc = mldebug("attach", *hosts, "--rank", "1", "--remote-python", str(no_debugpy), input=COMMANDS, timeout=240)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.splitlines()[0].startswith(f"mldebug: error: {job.ranks[1][0]}: missing debugpy: "), proc.stderr
    assert all(job.alive().values()) and not _leftovers(job)


def _killed_client_leaves_nothing(job: HungJob, where: list[str], listeners: set[str],
                                  env: dict[str, str] | None = None, sig: int = signal.SIGKILL) -> None:
    """A mldebug killed outright at the prompt: srun (sshd alike) ends the agent's stdin, the agent ends the
    adapter, the rank resumes (it was stopped at the prompt). Ctrl-C (SIGINT): mldebug detaches, exit 130."""
    from tests.fakes import pythonpath

    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    env["PYTHONPATH"] = pythonpath(env)
    m = subprocess.Popen([sys.executable, "-m", "ml_debug", "attach", *where, "--rank", "1", *REMOTE],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert m.stdout is not None
        first = m.stdout.readline()
        assert first.startswith(f"attached to pid {job.ranks[1][1]} "), first
        m.send_signal(sig)
        assert m.wait(timeout=60) == (130 if sig == signal.SIGINT else -sig)
    finally:
        m.kill()
        m.wait(timeout=30)
        for stream in (m.stdin, m.stdout, m.stderr):
            if stream is not None:
                stream.close()
    wait_until(lambda: not _leftovers(job), 30, "the agent and the adapter to end after their client died")
    assert _listening(job.root_pids[1]) == listeners
    wait_until(lambda: (main_thread_functions(job.root_pids[1]) or [""])[0] in ("load_batch", "stuck_here"), 30,
               "rank 1 to loop again")


def _venv_without_debugpy(path: Path) -> Path:
    """A Python with everything mldebug's own has, but debugpy (a node where it was never installed)."""
    from tests.package.envs import scratch_env

    return scratch_env(path, ["debugpy"]).python
