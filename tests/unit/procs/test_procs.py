"""Finding a job's ranks in the real process table: launchers, wrappers, labels, filters."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ml_debug.core.errors import UsageError
from ml_debug.procs import find_processes, labels_from_environ
from ml_debug.procs.find import is_python, launcher_kind
from ml_debug.procs.tree import ProcInfo
from tests.conftest import mldebug, pids_with_env, wait_until


def info(*argv: str, exe: str | None = None, name: str = "x") -> ProcInfo:
    return ProcInfo(pid=1, ppid=0, uid=0, user="root", state="S", cmdline=list(argv), exe=exe, name=name)


@pytest.mark.parametrize(("argv", "kind"), [
    (["/venv/bin/python3", "/venv/bin/torchrun", "--nproc-per-node", "8", "train.py"], "torchrun"),
    (["torchrun", "train.py"], "torchrun"),
    (["python", "-u", "-m", "torch.distributed.run", "train.py"], "torchrun"),
    (["python", "-m", "torch.distributed.launch", "train.py"], "torchrun"),
    (["python", "/venv/lib/python3.11/site-packages/torch/distributed/run.py", "x.py"], "torchrun"),
    (["/usr/bin/python3", "/usr/local/bin/deepspeed", "train.py"], "deepspeed"),
    (["python", "-m", "deepspeed.launcher.launch", "--world_info=x"], "deepspeed"),
    (["/venv/bin/python", "/venv/bin/accelerate", "launch", "train.py"], "accelerate"),
    (["accelerate", "config"], None),
    (["srun", "-N2", "python", "train.py"], "srun"),
    (["mpirun", "-np", "8", "python", "train.py"], "mpirun"),
    (["orted", "--hnp-topo-sig"], "mpirun"),
    (["python", "train.py"], None),
    (["bash", "-c", "python train.py"], None),
])
def test_launcher_kind(argv: list[str], kind: str | None) -> None:
    exe = "/usr/bin/python3.11" if argv[0].endswith(("python", "python3")) else None
    assert launcher_kind(info(*argv, exe=exe)) == kind


def test_slurmstepd_is_a_launcher() -> None:
    assert launcher_kind(info("slurmstepd: [42.0]", name="slurmstepd")) == "slurmstepd"


def test_python_by_exe_or_argv0() -> None:
    assert is_python(info("train", exe="/usr/bin/python3.11"))
    assert is_python(info("/venv/bin/python", "x.py"))
    assert not is_python(info("sleep", "1", exe="/usr/bin/sleep"))


def test_labels_from_each_launcher() -> None:
    torchrun = labels_from_environ({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "GROUP_RANK": "2",
                                    "SLURM_PROCID": "2"})
    assert (torchrun.rank, torchrun.local_rank, torchrun.world_size, torchrun.group_rank) == (5, 1, 8, 2)
    assert torchrun.rank_source == "RANK"
    slurm = labels_from_environ({"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_NODEID": "1"})
    assert (slurm.rank, slurm.local_rank, slurm.world_size, slurm.group_rank, slurm.rank_source) == \
        (3, 1, 4, 1, "SLURM_PROCID")
    ompi = labels_from_environ({"OMPI_COMM_WORLD_RANK": "7", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
                                "OMPI_COMM_WORLD_SIZE": "16"})
    assert (ompi.rank, ompi.local_rank, ompi.world_size) == (7, 3, 16)
    assert labels_from_environ({}).rank is None


LAUNCHER = """#!{python}
# a stand-in launcher named torchrun: one rank straight below it, one behind a shell, one non-Python child
import os, subprocess, sys, time
code = "import time, subprocess, sys\\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\\ntime.sleep(60)"
kids = []
for rank in range(2):
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MYJOB=sys.argv[1])
    if rank == 0:
        argv = [sys.executable, "-c", code]
    else:  # behind a wrapper shell that stays (no exec)
        argv = ["sh", "-c", f"{{sys.executable}} -c 'import time; time.sleep(60)'; true"]
    kids.append(subprocess.Popen(argv, env=env))
kids.append(subprocess.Popen(["sleep", "60"]))
print("ready", flush=True)
time.sleep(60)
"""


def test_ranks_under_a_launcher_through_a_shell_not_their_children(tmp_path: Path) -> None:
    script = tmp_path / "torchrun"
    script.write_text(LAUNCHER.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    token = f"job{os.getpid()}"
    proc = subprocess.Popen([sys.executable, str(script), token], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        # the rank's own child (a "data loader worker") is up too: three Python processes sleeping
        wait_until(lambda: len(_sleeping_pythons(token)) == 3, 30, "both ranks and rank 0's child to start")
        found = find_processes(pids=[proc.pid])
        assert [(t.rank, t.local_rank, t.world_size) for t in found.processes] == [(0, 0, 2), (1, 1, 2)]
        assert {t.found_by for t in found.processes} == {f"torchrun pid {proc.pid}"}
        assert {t.launcher_pid for t in found.processes} == {proc.pid}
        assert any(s["reason"] == "not a Python process" for s in found.skipped)
        assert [launcher.kind for launcher in found.launchers if launcher.pid == proc.pid] == ["torchrun"]
        # the same ranks by their environment, and the launcher itself on request
        by_env = find_processes(pattern=r"time\.sleep\(60\)", env={"MYJOB": token})
        # like pgrep -f, but Python only: both ranks and rank 0's own child (it inherits RANK), not the shell
        assert sorted(t.rank for t in by_env.processes) == [0, 0, 1]
        assert any(s["reason"] == "not a Python process" and s["cmdline"].startswith("sh -c")
                   for s in by_env.skipped)
        with_launcher = find_processes(pids=[proc.pid], include_launcher=True)
        assert proc.pid in {t.pid for t in with_launcher.processes}
        assert find_processes(pids=[proc.pid], user="no-such-user").processes == []
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def _sleeping_pythons(token: str) -> list[int]:
    """Pythons of the stand-in job (MYJOB=token) that have reached their time.sleep(60)."""
    out = []
    for pid in pids_with_env("MYJOB", token):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if "python" in Path(exe).name and any(b"time.sleep(60)" in a for a in argv):
            out.append(pid)
    return out


def test_never_picks_itself() -> None:
    found = find_processes(pattern="pytest")
    assert os.getpid() not in {t.pid for t in found.processes}


def test_bad_pattern_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        find_processes(pattern="(")


@pytest.mark.parametrize("command", ["dump-stacks", "top", "watch"])
def test_a_bad_pattern_is_said_once_before_any_node_is_asked(command: str) -> None:
    """Not as every node's agent failing to start (dump-stacks said 'not reached', exit 4; watch kept
    watching nodes that never answered): the hosts here do not exist, so reaching for them would fail
    differently."""
    proc = mldebug(command, "--hosts", "no-such-host-a,no-such-host-b", "--pattern", "(", timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "mldebug: error: --pattern '(' is not a valid regular expression: missing ), unterminated subpattern "
        "at position 0", "hint: use Python re syntax, e.g. --pattern 'train\\.py'"], proc.stderr
    assert proc.stdout == ""


def test_gpu_selection_says_why_when_there_is_no_gpu() -> None:
    from ml_debug.core.nvml import open_gateway

    gateway = open_gateway()
    status = gateway.open()
    gateway.close()
    found = find_processes(gpu=True, pids=[os.getpid()])
    assert found.processes == []  # only ourselves was named, and we are never picked
    if status.available:  # NVML works: the GPU holders are listed, and no excuse is given
        assert not [n for n in found.notes if n.startswith("--gpu-holders: ")], found.notes
    else:  # no NVIDIA GPU here: the reason, never a crash
        assert found.notes == [f"--gpu-holders: {status.reason}"], found.notes


def test_no_job_found_says_nothing_about_nvml_unless_gpu_was_asked() -> None:
    from ml_debug.procs.find import find_processes

    def about_gpus(note: str) -> bool:  # NVML's status reason reads "no NVIDIA GPU: ...", not "NVML"
        return any(word in note.lower() for word in ("gpu", "nvidia", "nvml"))

    found = find_processes(env={"MLDEBUG_NO_SUCH_JOB": "1"})
    assert not [n for n in found.notes if about_gpus(n)], found.notes
    proc = mldebug("dump-stacks", "--env", "MLDEBUG_NO_SUCH_JOB=1", timeout=60)
    said = (proc.stdout + proc.stderr).lower()  # (its hint may name the --gpu-holders option)
    assert proc.returncode == 3 and "nvidia" not in said and "nvml" not in said, proc.stdout + proc.stderr
    asked = find_processes(gpu=True, env={"MLDEBUG_NO_SUCH_JOB": "1"})
    from ml_debug.core.nvml import open_gateway

    if not open_gateway().open().available:
        assert any(n.startswith("--gpu-holders: ") for n in asked.notes), asked.notes


def test_a_user_this_node_does_not_have_is_said() -> None:
    """--user with a typo looked like "no job here" (top: exit 0, 0 ranks, not a word)."""
    assert find_processes(user="no_such_user_zq").notes[-1] == f"--user no_such_user_zq: no such user on {os.uname()[1]}"
    assert not [n for n in find_processes(user="root").notes if "no such user" in n]
    top = mldebug("top", "--once", "--user", "no_such_user_zq", timeout=60)
    assert "~ " in top.stdout and "--user no_such_user_zq: no such user on " in top.stdout, top.stdout
    stacks = mldebug("dump-stacks", "--user", "no_such_user_zq", timeout=60)
    assert stacks.returncode == 3 and "--user no_such_user_zq: no such user on " in stacks.stdout, stacks.stdout


def test_env_picks_a_rank_without_launcher_beside_another_launched_job(tmp_path: Path) -> None:
    """`--env` names the job: a launched job's ranks on the same node hid a rank whose launcher is gone
    (it was found only when no launcher had ranks at all)."""
    script = tmp_path / "torchrun"
    script.write_text(LAUNCHER.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    other, mine = f"job{os.getpid()}a", f"job{os.getpid()}b"
    launched = subprocess.Popen([sys.executable, str(script), other], stdout=subprocess.PIPE, start_new_session=True)
    alone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                             env={**os.environ, "RANK": "1", "WORLD_SIZE": "2", "MYJOB": mine})
    try:
        assert launched.stdout is not None and launched.stdout.readline().strip() == b"ready"
        wait_until(lambda: len(_sleeping_pythons(other)) == 3 and _sleeping_pythons(mine), 30, "both jobs to start")
        found = find_processes(env={"MYJOB": mine})
        assert [(t.pid, t.rank, t.found_by) for t in found.processes] == [(alone.pid, 1, "rank env")], found
        assert {t.rank for t in find_processes(env={"MYJOB": other}).processes} == {0, 1}  # the launched one still
    finally:
        os.killpg(launched.pid, 9)
        alone.kill()
        launched.wait()
        alone.wait()
