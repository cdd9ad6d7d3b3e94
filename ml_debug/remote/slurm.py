"""The Slurm transport: run one step inside a running job, one task on each of its nodes.

Shell equivalent::

    srun --jobid ID --overlap --nodes N --ntasks-per-node 1 -w NODES [--gres=gpu:0] --label CMD

``--overlap`` lets the step share the job's CPUs (without it srun waits for them forever);
``--gres=gpu:0`` keeps it from waiting for, or taking, the job's GPUs. All nodes run in one step
(one request to slurmctld, however many nodes). Each task wraps the command so that its node name
and exit status come back in band, on labelled lines that are stripped from the output.
"""

from __future__ import annotations

import getpass
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ml_debug.core import bounded, lifecycle
from ml_debug.core.errors import EnvironmentProblem, UsageError
from ml_debug.remote.hostlist import expand_hostlist
from ml_debug.remote.result import INTERRUPTED, TIMED_OUT, UNREACHABLE, NodeResult, decode, failed, finished
from ml_debug.remote.targets import Target

QUERY_TIMEOUT_S = 20.0
MARK = "@@mldebug@@"

# Runs on every node as `sh -c WRAPPER mldebug SCRIPT`. The script itself runs under bash when
# the node has it (`source venv/bin/activate` in --remote-prefix is a bashism). Markers go to
# both streams so a node is complete only when both have been read to its end.
WRAPPER = (
    f'printf "%s node %s\\n" "{MARK}" "${{SLURMD_NODENAME:-$(hostname)}}" >&2\n'
    'if command -v bash >/dev/null 2>&1; then bash -c "$1"; else sh -c "$1"; fi\n'
    'rc=$?\n'
    f'printf "\\n%s rc %s\\n" "{MARK}" "$rc"\n'
    f'printf "\\n%s rc %s\\n" "{MARK}" "$rc" >&2\n'
    'exit "$rc"\n'
)


@dataclass
class SlurmJob:
    """What squeue says about a job."""

    job_id: str
    state: str
    user: str
    nodes: list[str]
    gres_gpu: bool


def _slurm_cmd(argv: list[str], timeout_s: float = QUERY_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    try:
        return bounded.run(argv, timeout=timeout_s)
    except FileNotFoundError:
        raise EnvironmentProblem(f"{argv[0]} is not installed here",
                                 "run from a login node of the cluster (Slurm client tools on PATH)") from None
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(f"{argv[0]} did not answer within {timeout_s:g} s",
                                 "is slurmctld up? check `scontrol ping` and SLURM_CONF") from None


def job_info(job_id: str) -> SlurmJob:
    """The job's state, owner and nodes (``squeue -j ID -o '%T|%u|%N|%b'``); UsageError if unusable."""
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise UsageError(f"{job_id!r} is not a Slurm job id", "give the number squeue shows, e.g. --slurm-job 12345")
    proc = _slurm_cmd(["squeue", "-h", "-j", job_id, "-o", "%T|%u|%N|%b"])
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        why = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "squeue does not list it"
        raise UsageError(f"slurm job {job_id} not found: {why}",
                         "it may have ended; `squeue -u $USER` lists your jobs")
    state, user, nodelist, gres = (lines[0].split("|") + ["", "", "", ""])[:4]
    if state != "RUNNING":
        raise UsageError(f"slurm job {job_id} is {state}, not RUNNING",
                         "commands run inside a running job's allocation; wait until it starts")
    me = getpass.getuser()
    if user != me and os.geteuid() != 0:
        raise UsageError(f"slurm job {job_id} belongs to {user}, not to {me}",
                         "only the job's owner (or root) can start steps in it")
    nodes = expand_hostlist(nodelist)
    gpu = "gpu" in gres.lower()
    if not gpu:
        # `--gpus N` and `--gres` both end in the allocated TRES; squeue's %b only shows per-node.
        show = _slurm_cmd(["scontrol", "show", "job", "-o", job_id])
        gpu = "gres/gpu" in show.stdout
    return SlurmJob(job_id=job_id, state=state, user=user, nodes=nodes, gres_gpu=gpu)


# A step of mldebug's inside a user's job takes none of the job's memory: `--mem=0` on a step "restricts the step
# to the job's memory but does not remove any of it from what other steps can have" (srun(1)). Without it, where
# Slurm allocates memory (SelectTypeParameters=CR_*_Memory), the job's own step holds all of it and every
# overlapping step fails: "Unable to create step ...: Memory required by task is not available".
STEP_MEMORY = "--mem=0"


def srun_argv(job_id: str, nodes: list[str], script: str, gres_gpu: bool) -> list[str]:
    argv = ["srun", f"--jobid={job_id}", "--overlap", STEP_MEMORY, f"--nodes={len(nodes)}", "--ntasks-per-node=1",
            f"--ntasks={len(nodes)}", "-w", ",".join(nodes), "--label", "--kill-on-bad-exit=0",
            "--input=none"]
    if gres_gpu:
        argv.append("--gres=gpu:0")
    return [*argv, "sh", "-c", WRAPPER, "mldebug", script]


# Runs a stream's script under bash when the node has it (`source venv/bin/activate` in --remote-prefix).
STREAM_WRAPPER = 'if command -v bash >/dev/null 2>&1; then exec bash -c "$1"; else exec sh -c "$1"; fi'


def stream_argv(job_id: str, node: str, script: str, gres_gpu: bool, name: str,
                unbuffered: bool = False) -> list[str]:
    """One step on one node of the job that runs for as long as its stdin stays open (a streaming agent,
    such as top's), sharing the job's CPUs and taking none of its GPUs. ``unbuffered`` (``-u``): srun
    passes the output on as it comes, not line by line (a byte stream such as DAP has no lines)."""
    argv = ["srun", f"--jobid={job_id}", "--overlap", STEP_MEMORY, "--nodes=1", "--ntasks=1", "-w", node,
            "--kill-on-bad-exit=0", "-J", name, *(["-u"] if unbuffered else [])]
    if gres_gpu:
        argv.append("--gres=gpu:0")
    return [*argv, "sh", "-c", STREAM_WRAPPER, name, script]


def start_srun(argv: list[str], held: lifecycle.HeldSignals | None = None, **kwargs: Any) -> subprocess.Popen[Any]:
    """Every srun mldebug starts starts here: in a session of its own (a terminal's Ctrl-C is mldebug's to
    pass on, see :func:`stop_srun`), and tied to mldebug: when mldebug dies, even by SIGKILL, which no handler
    sees, the kernel sends srun SIGTERM (``PR_SET_PDEATHSIG``), on which srun cancels its step ("forcing job
    termination") and ends. Without it srun ran on with parent 1 and the command on the job's nodes with it.
    EnvironmentProblem when srun is not installed."""
    try:
        return lifecycle.popen_tied(argv, signal.SIGTERM, held, start_new_session=True, **kwargs)
    except FileNotFoundError:
        raise EnvironmentProblem("srun is not installed here", "run from a login node of the cluster") from None


_LABELLED = re.compile(r"^\s*(\d+): ?(.*)$")


@dataclass
class _Task:
    node: str | None = None
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)
    rc_out: int | None = None
    rc_err: int | None = None
    delivered: bool = False


def run_slurm(targets: list[Target], job_id: str, script: str, timeout_s: float, gres_gpu: bool,
              deliver: Callable[[NodeResult], None]) -> None:
    """One srun step over all targets; each node's result is delivered when its task ends."""
    nodes = [t.host for t in targets]
    t0 = time.monotonic()
    tasks: dict[int, _Task] = {}
    lock = threading.Lock()
    srun_errors: list[str] = []

    def complete(task: _Task) -> None:
        # Both streams carry "\n<MARK> rc N": drop the blank line it added, keep the rest.
        if task.delivered or task.node is None or task.rc_out is None or task.rc_err is None:
            return
        task.delivered = True
        deliver(finished(task.node, task.rc_out, _join(task.out), _join(task.err), time.monotonic() - t0))

    def reader(stream: object, is_err: bool) -> None:
        for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
            line = decode(raw).rstrip("\n")
            m = _LABELLED.match(line)
            if not m:
                if is_err:
                    srun_errors.append(line)
                continue
            idx, text = int(m.group(1)), m.group(2)
            with lock:
                task = tasks.setdefault(idx, _Task())
                if text.startswith(MARK + " node "):
                    task.node = text.split(" ", 2)[2]
                elif text.startswith(MARK + " rc "):
                    buf = task.err if is_err else task.out
                    if buf and buf[-1] == "":
                        buf.pop()
                    rc = int(text.split()[-1])
                    if is_err:
                        task.rc_err = rc
                    else:
                        task.rc_out = rc
                else:
                    (task.err if is_err else task.out).append(text)
                complete(task)

    argv = srun_argv(job_id, nodes, script, gres_gpu)
    with lifecycle.held_signals() as held:  # a Ctrl-C while srun starts is raised in the try, which stops it
        proc = start_srun(argv, held, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        readers = [threading.Thread(target=reader, args=(proc.stdout, False), daemon=True),
                   threading.Thread(target=reader, args=(proc.stderr, True), daemon=True)]
        for r in readers:
            r.start()
        timed_out = interrupted = False
        try:
            held.release()
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        except KeyboardInterrupt:  # the step is cancelled below; what each task printed is kept
            interrupted = True
        finally:
            if proc.poll() is None:
                stop_srun(proc)
            for r in readers:
                r.join(timeout=5)
    elapsed = time.monotonic() - t0
    with lock:
        by_node = {t.node: t for t in tasks.values() if t.node is not None}
        for node in nodes:
            task = by_node.get(node)
            if task is not None and task.delivered:
                continue
            out = _join(task.out) if task else ""
            err = _join(task.err) if task else ""
            if interrupted:
                deliver(failed(node, INTERRUPTED, "stopped by Ctrl-C" if task else "Ctrl-C before it started",
                               elapsed, stdout=out, stderr=err))
            elif timed_out:
                why = f"still running after {timeout_s:g} s; step cancelled"
                if task is None and srun_errors:  # never started: say what srun was waiting for
                    why = f"the step did not start within {timeout_s:g} s: {srun_errors[-1].removeprefix('srun: ')}"
                deliver(failed(node, TIMED_OUT, why, elapsed, stdout=out, stderr=err))
            else:
                why = "; ".join(e.removeprefix("srun: error: ") for e in srun_errors if node in e) \
                    or "; ".join(e.removeprefix("srun: error: ") for e in srun_errors[-3:]) \
                    or f"srun exited with status {proc.returncode} before this node reported"
                deliver(failed(node, UNREACHABLE, why, elapsed, stdout=out, stderr=err))
    if interrupted:
        raise KeyboardInterrupt


def stop_srun(proc: subprocess.Popen[bytes]) -> None:
    # srun cancels its step on two SIGINTs within a second; then make sure it is gone.
    for sig in (signal.SIGINT, signal.SIGINT):
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _join(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)
