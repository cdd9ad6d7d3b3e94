"""Where a drill's job runs: on this node (ranks started here), or as a Slurm job over several nodes.

Both give the drills the same four things: a long training job with a fault (and the target words
that reach its ranks: ``--pid P`` or ``--slurm-job J``), a job that ends by itself under `mldebug launch`
(its logs folder), gpu-test with one rank never started, and allreduce-bench --pairwise with one slow
link. In Slurm mode a job's batch script is written into the drill's folder (evidence), with every
value quoted (``shlex.quote``); the job inherits the drill's environment (sbatch's default
``--export=ALL``), so a variable such as GLOO_SOCKET_IFNAME set for the drill reaches the ranks.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ml_debug.core import bounded
from ml_debug.core.errors import EnvironmentProblem, UsageError
from ml_debug.drill.workspace import TOKEN_VAR, DrillError, Workspace, free_port, last_step

if TYPE_CHECKING:
    from ml_debug.remote.ssh import SshPool
    from ml_debug.remote.targets import Target, TargetSpec

TRAIN = ["--preset", "tiny", "--steps", "100000"]
# a stage timeout with room for a loaded node (a rank's first stage includes importing torch)
GPU_TEST_TIMEOUT = "10"
GPU_TEST = ["gpu-test", "--json", "--stage-timeout", GPU_TEST_TIMEOUT, "--backend", "gloo", "--device", "cpu"]
PAIRWISE = ["allreduce-bench", "--pairwise", "--backend", "gloo", "--device", "cpu", "-e", "256K", "-n", "5", "-w", "1",
            "--slow-threshold", "0.7"]
SLURM_QUERY_S = 30.0


@dataclass
class Job:
    """A running job: the words that point mldebug's diagnosis at its ranks, and a liveness check."""

    target: list[str]
    alive: Callable[[], None]  # raises DrillError when the job is gone


@dataclass
class Output:
    """What a job that is its own diagnosis (gpu-test, allreduce-bench) printed, and how long it ran."""

    text: str
    seconds: float
    shown: str


class Site(Protocol):
    name: str
    nodes: int

    def node_of(self, ws: Workspace, rank: int, nproc: int) -> str: ...
    def train(self, ws: Workspace, nproc: int, fault: str, env: dict[str, str]) -> Job: ...
    def launched(self, ws: Workspace, nproc: int, train_args: list[str]) -> Path: ...
    def missing_rank(self, ws: Workspace, nproc: int, skip: int) -> Output: ...
    def slow_link(self, ws: Workspace, nproc: int, env: dict[str, str]) -> Output: ...
    def teardown(self, ws: Workspace) -> None: ...


def wait_for_step(ws: Workspace, job: Job, world: int, step: int) -> None:
    """Until every rank's metrics file reached ``step`` (the step before the fault)."""

    def reached() -> bool | None:
        job.alive()
        steps = [last_step(ws.dir / "metrics" / f"rank-{r}.jsonl") for r in range(world)]
        return True if all(s is not None and s >= step for s in steps) else None

    ws.wait_for(f"every rank to reach step {step}", reached, limit_s=240)


# -- this node -----------------------------------------------------------------------------------
class LocalSite:
    name = "local"
    nodes = 1

    def node_of(self, ws: Workspace, rank: int, nproc: int) -> str:
        import socket

        return socket.gethostname()

    def train(self, ws: Workspace, nproc: int, fault: str, env: dict[str, str]) -> Job:
        proc = ws.start(["train", "--nproc-per-node", str(nproc), *TRAIN,
                         "--collective-timeout", f"{max(ws.left(), 30):.0f}",
                         "--metrics-dir", str(ws.dir / "metrics"), "--inject", fault], "job.log", env)
        return Job(["--pid", str(proc.pid)], lambda: ws.alive(proc, "job.log"))

    def launched(self, ws: Workspace, nproc: int, train_args: list[str]) -> Path:
        proc = ws.start([sys.executable, "-m", "ml_debug", "launch", "--nproc-per-node", str(nproc),
                         "--log-dir", str(ws.dir / "logs"), "--", sys.executable, "-m", "ml_debug.train",
                         *train_args], "launch.log")
        ws.finish(proc, "the launched job")
        return ws.dir / "logs"

    def missing_rank(self, ws: Workspace, nproc: int, skip: int) -> Output:
        port = free_port()
        t0 = time.monotonic()
        procs = {}
        for r in range(nproc):
            if r != skip:
                env = {"RANK": str(r), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(nproc),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
                procs[r] = ws.start([sys.executable, "-m", "ml_debug", *GPU_TEST], f"rank{r}.log", env)
        for r, proc in procs.items():
            ws.finish(proc, f"gpu-test rank {r}")
        return Output((ws.dir / "rank0.log").read_text(errors="replace"), time.monotonic() - t0,
                      f"mldebug gpu-test --stage-timeout {GPU_TEST_TIMEOUT} ({nproc - 1} of {nproc} ranks started)")

    def slow_link(self, ws: Workspace, nproc: int, env: dict[str, str]) -> Output:
        argv = [*PAIRWISE[:2], "--nproc-per-node", str(nproc), *PAIRWISE[2:]]
        ran = ws.mldebug(argv, "allreduce-bench.json", env, limit_s=180)
        return Output((ws.dir / "allreduce-bench.json").read_text(), ran.seconds, ran.shown)

    def teardown(self, ws: Workspace) -> None:
        pass


# -- a Slurm job per drill -------------------------------------------------------------------------
@dataclass
class SlurmSite:
    """Each drill is one batch job of ``nodes`` nodes in ``partition`` (``sbatch_args`` added as given)."""

    partition: str | None
    nodes: int
    sbatch_args: list[str] = field(default_factory=list)
    name: str = "slurm"
    jobs: dict[str, list[str]] = field(default_factory=dict)  # drill folder -> its job ids
    allocated: dict[str, list[str]] = field(default_factory=dict)  # job id -> its nodes, in SLURM_NODEID order

    def node_of(self, ws: Workspace, rank: int, nproc: int) -> str:
        nodes = self._nodes(ws)
        return nodes[rank // nproc] if rank // nproc < len(nodes) else "?"

    def train(self, ws: Workspace, nproc: int, fault: str, env: dict[str, str]) -> Job:
        train = [sys.executable, "-m", "ml_debug.train", *TRAIN, "--collective-timeout", f"{max(ws.left(), 30):.0f}",
                 "--metrics-dir", str(ws.dir / "metrics"), "--inject", fault]
        job = self._submit(ws, self._launch_script(ws, nproc, train), self.nodes, 1, env)
        self._wait_running(ws, job)
        return Job(["--slurm-job", job], lambda: self._alive(ws, job))

    def launched(self, ws: Workspace, nproc: int, train_args: list[str]) -> Path:
        train = [sys.executable, "-m", "ml_debug.train", *train_args]
        job = self._submit(ws, self._launch_script(ws, nproc, train), self.nodes, 1, {})
        self._wait_end(ws, job)
        return ws.dir / "logs"

    def missing_rank(self, ws: Workspace, nproc: int, skip: int) -> Output:
        world = nproc * self.nodes
        program = shlex.join([sys.executable, "-m", "ml_debug", *GPU_TEST])
        (ws.dir / "multi-prog.conf").write_text(f"{skip} true\n* {program}\n")
        script = (f"{_MASTER}exec srun --kill-on-bad-exit=0 --multi-prog "
                  f"{shlex.quote(str(ws.dir / 'multi-prog.conf'))}\n")
        t0 = time.monotonic()
        job = self._submit(ws, script, self.nodes, nproc, {})
        self._wait_end(ws, job)
        return Output((ws.dir / "job.out").read_text(errors="replace"), time.monotonic() - t0,
                      f"srun mldebug gpu-test --stage-timeout {GPU_TEST_TIMEOUT} (task {skip} of {world} never started)")

    def slow_link(self, ws: Workspace, nproc: int, env: dict[str, str]) -> Output:
        program = shlex.join([sys.executable, "-m", "ml_debug", *PAIRWISE, "--json"])
        t0 = time.monotonic()
        job = self._submit(ws, f"{_MASTER}exec srun --kill-on-bad-exit=0 {program}\n", max(3, self.nodes), 1, env)
        self._wait_end(ws, job)
        return Output((ws.dir / "job.out").read_text(errors="replace"), time.monotonic() - t0,
                      "srun mldebug allreduce-bench --pairwise (one task per node)")

    def teardown(self, ws: Workspace) -> None:
        for job in self.jobs.get(str(ws.dir), []):
            _slurm(["scancel", job])
        end = time.monotonic() + 30
        while time.monotonic() < end and any(self._listed(j) for j in self.jobs.get(str(ws.dir), [])):
            time.sleep(0.5)

    # -- helpers ---------------------------------------------------------------------------------
    def _launch_script(self, ws: Workspace, nproc: int, train: list[str]) -> str:
        launch = [sys.executable, "-m", "ml_debug", "launch", "--nproc-per-node", str(nproc),
                  "--nnodes", str(self.nodes), "--log-dir", str(ws.dir / "logs"), "--", *train]
        # static rendezvous: node rank = SLURM_NODEID, so rank r runs on the (r // nproc)-th node of the job
        return (f"{_MASTER}exec srun --kill-on-bad-exit=0 {shlex.join(launch[:6])} --master-addr \"$MASTER_ADDR\" "
                f"--master-port \"$MASTER_PORT\" {shlex.join(launch[6:])}\n")

    def _submit(self, ws: Workspace, body: str, nodes: int, tasks_per_node: int, env: dict[str, str]) -> str:
        script = ws.dir / "job.sbatch"
        script.write_text(f"#!/bin/bash\n# written by mldebug drill for {ws.dir.name}\nset -u\n"
                          f"export MASTER_PORT={free_port()}\n{body}")
        argv = ["sbatch", "--parsable", "-N", str(nodes), f"--ntasks-per-node={tasks_per_node}",
                "-o", str(ws.dir / "job.out"), f"--chdir={ws.dir}", "-J", f"mldebug-drill-{ws.dir.name}",
                "--time=00:30:00"]
        if self.partition:
            argv += ["-p", self.partition]
        proc = _slurm([*argv, *self.sbatch_args, str(script)], env=ws.env(env))
        if proc.returncode != 0:
            raise DrillError(f"sbatch failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ''}")
        job = proc.stdout.strip().split(";")[0]
        self.jobs.setdefault(str(ws.dir), []).append(job)
        return job

    def _listed(self, job: str) -> bool:
        return bool(_slurm(["squeue", "-h", "-j", job, "-o", "%i"]).stdout.strip())

    def _alive(self, ws: Workspace, job: str) -> None:
        if not self._listed(job):
            raise DrillError(f"slurm job {job} ended early (see {ws.dir / 'job.out'})")

    def _state(self, job: str) -> str:
        """The job's state ("" once it left the queue); its nodes are noted while it runs."""
        from ml_debug.remote.hostlist import expand_hostlist

        state, _, nodes = _slurm(["squeue", "-h", "-j", job, "-o", "%T|%N"]).stdout.strip().partition("|")
        if state == "RUNNING" and nodes and job not in self.allocated:
            self.allocated[job] = expand_hostlist(nodes)
        return state

    def _wait_running(self, ws: Workspace, job: str) -> None:
        def running() -> bool | None:
            state = self._state(job)
            if not state:
                raise DrillError(f"slurm job {job} ended before it ran (see {ws.dir / 'job.out'})")
            return True if state == "RUNNING" else None

        ws.wait_for(f"slurm job {job} to start", running, limit_s=120, period_s=1.0)

    def _wait_end(self, ws: Workspace, job: str) -> None:
        ws.wait_for(f"slurm job {job} to end", lambda: None if self._state(job) else True, period_s=0.5)

    def _nodes(self, ws: Workspace) -> list[str]:
        jobs = self.jobs.get(str(ws.dir), [])
        return self.allocated.get(jobs[-1], []) if jobs else []


# The batch script runs on the job's first node: its short name is the rendezvous address when it
# resolves, else its first address (clusters whose node names are not in DNS).
_MASTER = ('MASTER_ADDR=$(hostname -s)\n'
           'getent hosts "$MASTER_ADDR" >/dev/null || MASTER_ADDR=$(hostname -I | cut -d" " -f1)\n'
           'export MASTER_ADDR\n')


def check_slurm_request(partition: str, sbatch_args: list[str]) -> None:
    """A partition Slurm does not have, or an empty --sbatch-arg, is one usage error before any drill runs,
    not every drill failing to submit ("could not run", exit 4)."""
    if any(not arg.strip() for arg in sbatch_args):
        raise UsageError("--sbatch-arg is empty", "give one sbatch option per --sbatch-arg, e.g. --sbatch-arg=--account=ml")
    try:
        proc = _slurm(["scontrol", "show", "partition", partition])
    except DrillError as e:
        raise EnvironmentProblem(str(e), "run from a node with the Slurm client tools and SLURM_CONF set") from None
    if proc.returncode != 0:
        said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise UsageError(f"--slurm-partition {partition}: {said[-1] if said else 'not known to Slurm'}",
                         "list the partitions with: sinfo -s")


def _slurm(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return bounded.run(argv, timeout=SLURM_QUERY_S, env=env)
    except FileNotFoundError:
        raise DrillError(f"{argv[0]} is not installed here (Slurm client tools are needed for --slurm)") from None
    except subprocess.TimeoutExpired:
        raise DrillError(f"{argv[0]} did not answer within {SLURM_QUERY_S:g} s") from None


# -- hosts over ssh ----------------------------------------------------------------------------------
FORWARDED_PREFIXES = ("GLOO_", "NCCL_", "TORCH_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
"""Variables of the drill's environment that its ssh jobs get too (an ssh session starts a fresh one)."""


class SshSite:
    """Each drill's job runs on ``nodes`` of the hosts, one ssh session per node (or per rank of gpu-test);
    every session's command carries the drill's token, and teardown stops what still runs by it."""

    name = "ssh"

    def __init__(self, spec: TargetSpec, target_words: list[str]) -> None:
        self.spec = spec
        self.hosts = spec.targets
        self.nodes = len(self.hosts)
        self.words = target_words  # how the diagnosis reaches the same hosts: --hosts ... --ssh-config ...
        self.python = spec.remote_python or "python3"
        self._pool: SshPool | None = None
        self._sessions: list[tuple[str, threading.Thread]] = []  # (node, thread) of the running jobs

    def node_of(self, ws: Workspace, rank: int, nproc: int) -> str:
        i = rank // nproc
        return self.hosts[i].host if i < len(self.hosts) else "?"

    def train(self, ws: Workspace, nproc: int, fault: str, env: dict[str, str]) -> Job:
        train = [self.python, "-m", "ml_debug.train", *TRAIN, "--collective-timeout", f"{max(ws.left(), 30):.0f}",
                 "--metrics-dir", str(ws.dir / "metrics"), "--inject", fault]
        self._launch(ws, nproc, train, env)
        return Job([*self.words, "--env", f"{TOKEN_VAR}={ws.token}"], lambda: self._alive(ws))

    def launched(self, ws: Workspace, nproc: int, train_args: list[str]) -> Path:
        self._launch(ws, nproc, [self.python, "-m", "ml_debug.train", *train_args], {})
        ws.wait_for("the job to end on every node", lambda: None if self._running() else True, period_s=0.5)
        return ws.dir / "logs"

    def missing_rank(self, ws: Workspace, nproc: int, skip: int) -> Output:
        world, port, master = nproc * self.nodes, free_port(), self._master()
        t0 = time.monotonic()
        for i, host in enumerate(self.hosts):
            lines = []
            for local in range(nproc):
                r = i * nproc + local
                if r == skip:
                    continue
                env = {"RANK": r, "WORLD_SIZE": world, "LOCAL_RANK": local, "LOCAL_WORLD_SIZE": nproc,
                       "MASTER_ADDR": master, "MASTER_PORT": port}
                lines.append(" ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items()) + " "
                             + shlex.join([self.python, "-m", "ml_debug", *GPU_TEST]) + f" > {shlex.quote(str(ws.dir / f'rank{r}.log'))} 2>&1 &")
            self._start(ws, host, "\n".join([*lines, "wait"]), {})
        ws.wait_for("gpu-test to end on every node", lambda: None if self._running() else True, period_s=0.5)
        return Output((ws.dir / "rank0.log").read_text(errors="replace"), time.monotonic() - t0,
                      f"mldebug gpu-test --stage-timeout {GPU_TEST_TIMEOUT} over ssh "
                      f"(rank {skip} of {world} never started)")

    def slow_link(self, ws: Workspace, nproc: int, env: dict[str, str]) -> Output:
        if self.nodes < 3:
            raise DrillError("slow-link over ssh needs at least 3 hosts (its units are nodes)")
        port, master = free_port(), self._master()
        t0 = time.monotonic()
        for i, host in enumerate(self.hosts):
            argv = [self.python, "-m", "ml_debug", *PAIRWISE[:2], "--nproc-per-node", "1", "--nnodes", str(self.nodes),
                    "--node-rank", str(i), "--master-addr", master, "--master-port", str(port), *PAIRWISE[2:], "--json"]
            self._start(ws, host, shlex.join(argv) + f" > {shlex.quote(str(ws.dir / f'node{i}.log'))} 2>&1", env)
        ws.wait_for("the bench to end on every node", lambda: None if self._running() else True, period_s=0.5)
        return Output((ws.dir / "node0.log").read_text(errors="replace"), time.monotonic() - t0,
                      f"mldebug allreduce-bench --pairwise over ssh ({self.nodes} nodes)")

    def teardown(self, ws: Workspace) -> None:
        if self._running():
            # "[N]" keeps the pattern from matching the shell that runs pkill (its own command line)
            pattern = f"{TOKEN_VAR[:-1]}[{TOKEN_VAR[-1]}]={ws.token}"
            for host in self.hosts:
                self._pool_run(host, shlex.join(["pkill", "-TERM", "-f", pattern]), 15)
            end = time.monotonic() + 20
            while time.monotonic() < end and self._running():
                time.sleep(0.2)
        self._sessions = []
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # -- helpers ---------------------------------------------------------------------------------
    def _launch(self, ws: Workspace, nproc: int, train: list[str], env: dict[str, str]) -> None:
        port, master = free_port(), self._master()
        for i, host in enumerate(self.hosts):
            launch = [self.python, "-m", "ml_debug", "launch", "--nproc-per-node", str(nproc), "--nnodes",
                      str(self.nodes), "--node-rank", str(i), "--master-addr", master, "--master-port", str(port),
                      "--log-dir", str(ws.dir / "logs"), "--", *train]
            self._start(ws, host, shlex.join(launch) + f" > {shlex.quote(str(ws.dir / f'node{i}.log'))} 2>&1", env)

    def _start(self, ws: Workspace, host: Target, command: str, env: dict[str, str]) -> None:
        variables = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIXES)}
        variables.update({TOKEN_VAR: ws.token, "PYTHONUNBUFFERED": "1", **env})
        exports = "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(variables.items()))
        prefix = f"{self.spec.remote_prefix}\n" if self.spec.remote_prefix else ""
        script = f"{prefix}{exports}\n{command}\n"
        thread = threading.Thread(target=self._pool_run, args=(host, script, max(ws.left(), 1.0)),
                                  name=f"mldebug-drill-{host.label}", daemon=True)
        thread.start()
        self._sessions.append((host.label, thread))

    def _pool_run(self, host: Target, script: str, timeout_s: float) -> None:
        self._connections().run(host, script, timeout_s)

    def _connections(self) -> SshPool:
        from ml_debug.remote.ssh import SshPool

        if self._pool is None:
            self._pool = SshPool(self.spec, self.spec.connect_timeout_s)
        return self._pool

    def _running(self) -> bool:
        return any(t.is_alive() for _, t in self._sessions)

    def _alive(self, ws: Workspace) -> None:
        ended = [label for label, t in self._sessions if not t.is_alive()]
        if ended:
            raise DrillError(f"the job ended early on {', '.join(ended)} (see {ws.dir}/node*.log)")

    def _master(self) -> str:
        """The first host's address as ssh reaches it (after the ssh config): the rendezvous address."""
        return self._connections().endpoint(self.hosts[0]).hostname
