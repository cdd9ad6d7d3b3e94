"""Pytest fixtures for the real test rig: loopback sshd, network-namespace nodes, Slurm, hung jobs.

Loaded by tests/conftest.py (`pytest_plugins`). The rig's parts are brought up on first use by
tests/rig/up.sh (idempotent, quick when already up) and left running after the session, unless
MLDEBUG_RIG_TEARDOWN=1 (then tests/rig/down.sh runs at the end). A part that cannot be brought up
FAILS the test in CI (MLDEBUG_REQUIRE_REAL=1) and skips it elsewhere, through `require()`.

Fixtures (see each class for its fields):
  rig_ssh    session  SshRig      loopback sshd hosts + the netns nodes' sshd, keys, ssh_config
  rig_nodes  session  list[NetnsNode]
  rig_slurm  session  SlurmRig    slurmctld here, one slurmd inside each netns node, gres gpu:2
  hung_job   function factory     hung_job(nranks=4, odd_rank=None, odd_function="stuck_here",
                                  mode="hang", where="local", nodes=2) -> HungJob
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ml_debug.core import lifecycle

RIG_DIR = Path(__file__).resolve().parent
WORKER = RIG_DIR / "hung_worker.py"
TOKEN_VAR = "MLDEBUG_RIG_JOB"  # in the environment of every process a hung job starts
_PORTS = itertools.count(os.getpid() % 3000)


def rig_port() -> int:
    """A TCP port for a listener inside the rig's nodes (MASTER_PORT, a test's own sshd). The nodes'
    network namespaces are shared by both xdist workers: each worker draws from its own 3000 ports, in
    turn, so two tests never pick the same one (random ports could), and below the ephemeral range
    (32768 and up), so no outgoing connection in a node holds it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    return 20000 + (int(worker) % 4 if worker.isdigit() else 0) * 3000 + next(_PORTS) % 3000


def rig_base() -> Path:
    return Path(os.environ.get("RIG_BASE", "/tmp/mldebug-rig"))


# ----------------------------------------------------------------------------- bring-up

_part_errors: dict[str, str | None] = {}  # part -> None (up) or why not; once per session


def ensure_rig(*parts: str) -> dict[str, str | None]:
    """Bring up the named parts (ssh, netns, slurm) once per session: `bash tests/rig/up.sh PARTS`.

    Returns part -> None when up, else the reason. Callers decide (fixtures call `require`).
    """
    todo = [p for p in parts if p not in _part_errors]
    if todo:
        if os.geteuid() != 0:
            for p in todo:
                _part_errors[p] = "the rig needs root (sshd, network namespaces, slurmd)"
        else:
            try:
                proc = subprocess.run(["bash", str(RIG_DIR / "up.sh"), *todo], capture_output=True,
                                      text=True, timeout=300)
                out = (proc.stdout + proc.stderr).strip()
            except subprocess.TimeoutExpired as e:
                out = f"up.sh timed out after 300 s: {e.stdout!r}"
            status = _read_status()
            for p in todo:
                _part_errors[p] = None if status.get(p) == "ok" else \
                    f"tests/rig/up.sh {p} failed:\n" + "\n".join(out.splitlines()[-25:])
    return {p: _part_errors[p] for p in parts}


def _read_status() -> dict[str, str]:
    try:
        lines = (rig_base() / "status").read_text().splitlines()
    except OSError:
        return {}
    return dict(line.split()[:2] for line in lines if len(line.split()) >= 2)


def _require_parts(*parts: str) -> None:
    from tests.conftest import require

    for part, err in ensure_rig(*parts).items():
        require(err is None, f"rig part {part!r}: {err}")


# ----------------------------------------------------------------------------- ssh


@dataclass(frozen=True)
class SshHost:
    """One sshd of the rig. `name` is its Host alias in SshRig.ssh_config."""
    name: str
    address: str
    port: int

    @property
    def target(self) -> str:
        """`address:port`, the form hostfiles with ports use."""
        return f"{self.address}:{self.port}"


@dataclass
class SshRig:
    """The rig's sshd daemons and the client files that reach them (user root, key only)."""
    hosts: list[SshHost]          # loopback sshd: p2222..p2225 on 127.0.0.1 (same `hostname`)
    nodes: list[SshHost]          # one sshd per netns node: node1..node3 at <ip>:22 (own hostname)
    bad_hostkey_host: SshHost     # badkey: 127.0.0.1:2226, its host key differs from known_hosts
    client_key: Path              # private key in authorized_keys
    alt_client_key: Path          # private key NOT in authorized_keys (auth is refused)
    known_hosts: Path             # the real host key of every good host; the good key for badkey
    ssh_config: Path              # Host aliases for all of the above, StrictHostKeyChecking yes
    host_key_pub: Path            # public host key of the good sshd daemons
    bad_host_key_pub: Path        # public host key the bad host really presents
    base: Path

    def hostfile(self, hosts: Sequence[SshHost] | None = None, path: Path | None = None,
                 style: str = "alias", slots: int | None = None) -> Path:
        """Write a hostfile, one host a line: style "alias" (p2222, node1: resolved through
        ssh_config), "address" (127.0.0.1:2222, 10.213.7.11:22) or "ip" (address only); with
        `slots`, each line gets " slots=N" (DeepSpeed/MPI style). Default hosts: self.hosts."""
        hosts = list(self.hosts if hosts is None else hosts)
        if style not in ("alias", "address", "ip"):
            raise ValueError(f"style must be alias, address or ip, not {style!r}")
        if path is None:
            d = self.base / "hostfiles"
            d.mkdir(parents=True, exist_ok=True)
            path = d / f"hosts-{uuid.uuid4().hex[:8]}"
        lines = []
        for h in hosts:
            word = h.name if style == "alias" else h.target if style == "address" else h.address
            lines.append(word + (f" slots={slots}" if slots is not None else ""))
        path.write_text("".join(line + "\n" for line in lines))
        return path

    def ssh_argv(self, host: SshHost | str, *command: str) -> list[str]:
        """`ssh -F <rig ssh_config> <alias> -- command...` (command joined with shlex.quote)."""
        name = host.name if isinstance(host, SshHost) else host
        argv = ["ssh", "-F", str(self.ssh_config), name]
        return argv + ([" ".join(shlex.quote(c) for c in command)] if command else [])

    def ssh(self, host: SshHost | str, *command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a command on a rig host with the ssh binary."""
        return subprocess.run(self.ssh_argv(host, *command), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)


def _read_hosts(path: Path) -> list[SshHost]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        w = line.split()
        if len(w) >= 3:
            out.append(SshHost(w[0], w[1], int(w[2])))
    return out


def load_ssh_rig(base: Path | None = None) -> SshRig:
    """The SshRig described by the files ssh_up.sh / netns_up.sh wrote under RIG_BASE."""
    base = base or rig_base()
    d = base / "ssh"
    bad = _read_hosts(d / "bad_host")
    return SshRig(
        hosts=_read_hosts(d / "hosts"),
        nodes=[SshHost(n.name, n.ip, 22) for n in load_nodes(base)],
        bad_hostkey_host=bad[0] if bad else SshHost("badkey", "127.0.0.1", 2226),
        client_key=d / "client_key", alt_client_key=d / "alt_client_key",
        known_hosts=d / "known_hosts", ssh_config=d / "ssh_config",
        host_key_pub=d / "host_ed25519.pub", bad_host_key_pub=d / "bad_host_ed25519.pub", base=base)


@pytest.fixture(scope="session")
def rig_ssh() -> SshRig:
    """Loopback sshd hosts (and the netns nodes' sshd): brought up once per session."""
    _require_parts("ssh", "netns")
    rig = load_ssh_rig()
    from tests.conftest import require
    require(rig.hosts and rig.nodes, f"rig ssh hosts/nodes listed under {rig.base}")
    return rig


# ----------------------------------------------------------------------------- netns nodes


@dataclass(frozen=True)
class NetnsNode:
    """A simulated cluster node: own network namespace (eth0 = ip), hostname, PID namespace and
    /proc, with its own sshd on ip:22. `init_pid` is the root-namespace pid of the node's PID 1."""
    name: str
    ip: str
    init_pid: int

    def nsenter_argv(self, argv: Sequence[str]) -> list[str]:
        """`nsenter -t <init> -n -p -m -u -- argv`: run argv inside the node (as its ssh would)."""
        return ["nsenter", "-t", str(self.init_pid), "-n", "-p", "-m", "-u", "--", *argv]

    def run(self, argv: Sequence[str], timeout: float = 30, env: dict[str, str] | None = None,
            input: str | None = None, check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run argv inside the node and capture its output (text)."""
        return subprocess.run(self.nsenter_argv(argv), capture_output=True, text=True, timeout=timeout,
                              env=env, input=input, check=check,
                              stdin=None if input is not None else subprocess.DEVNULL)

    def pidns(self) -> int:
        """Inode of the node's PID namespace (compare with os.stat(f"/proc/{pid}/ns/pid").st_ino)."""
        return os.stat(f"/proc/{self.init_pid}/ns/pid").st_ino

    def root_pid(self, local_pid: int) -> int | None:
        """The root-namespace pid of the process the node knows as `local_pid` (None if gone)."""
        return _root_pid_of(self.pidns(), local_pid)


def load_nodes(base: Path | None = None) -> list[NetnsNode]:
    path = (base or rig_base()) / "netns" / "nodes"
    if not path.exists():
        return []
    nodes = []
    for line in path.read_text().splitlines():
        w = line.split()
        if len(w) >= 3:
            nodes.append(NetnsNode(w[0], w[1], int(w[2])))
    return nodes


@pytest.fixture(scope="session")
def rig_nodes() -> list[NetnsNode]:
    """The network-namespace nodes node1..node3 (brought up once per session)."""
    _require_parts("netns")
    nodes = load_nodes()
    from tests.conftest import require
    require(nodes and all(os.path.exists(f"/proc/{n.init_pid}") for n in nodes), "rig netns nodes alive")
    return nodes


# ----------------------------------------------------------------------------- slurm


@dataclass
class SlurmRig:
    """A real Slurm 22.05 cluster: slurmctld in the root namespace, one slurmd inside each netns node
    (partition "debug", CPUs per node from SLURM_CPUS, fake GRES gpu:2 per node backed by /dev/null-like
    char devices: `--gres=gpu:0` and `--gres=gpu:N` both work). Run Slurm commands with `env`."""
    conf: Path
    env: dict[str, str]            # os.environ + SLURM_CONF=<conf>
    nodes: list[str]               # node1..node3
    node_ips: dict[str, str]
    gpus_per_node: int
    base: Path

    def run(self, argv: Sequence[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (squeue, srun, scontrol ...) against this cluster."""
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=self.env,
                              stdin=subprocess.DEVNULL)

    def sbatch(self, argv: Sequence[str], nodes: int = 1, ntasks_per_node: int = 1,
               extra: Sequence[str] = (), env: dict[str, str] | None = None, srun: bool = True,
               output: Path | None = None) -> str:
        """Submit a batch job whose script runs `srun argv` (nodes x ntasks_per_node tasks; with
        srun=False the script runs argv itself, once). `extra` goes to sbatch (e.g. ["-w", "node1,node2"],
        ["--gres=gpu:2"]); `env` is added to the job's environment. Returns the job id."""
        jobs = self.base / "slurm" / "jobs"
        jobs.mkdir(parents=True, exist_ok=True)
        cmd = " ".join(shlex.quote(a) for a in argv)
        script = "#!/bin/bash\n" + (f"exec srun {cmd}\n" if srun else f"exec {cmd}\n")
        proc = subprocess.run(
            ["sbatch", "--parsable", "-N", str(nodes), f"--ntasks-per-node={ntasks_per_node}",
             "-o", str(output or jobs / "%j.out"), f"--chdir={jobs}", *extra],
            input=script, capture_output=True, text=True, timeout=30, env={**self.env, **(env or {})})
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch failed (rc={proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout.strip().split(";")[0]

    def wait_running(self, job: str, timeout: float = 30) -> None:
        """Wait until the job's first step (<job>.0) is running and every one of its tasks has exec'd
        its program; raise TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            steps = self.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"]).stdout.split()
            # the step is listed before its tasks have exec'd: count the tasks that have
            if f"{job}.0" in steps and self._step_tasks_started(job):
                return
            state = self.run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip()
            if not state:
                out = self.base / "slurm" / "jobs" / f"{job}.out"
                tail = out.read_text()[-2000:] if out.exists() else ""
                raise RuntimeError(f"slurm job {job} ended before its step ran; output:\n{tail}")
            time.sleep(0.1)
        raise TimeoutError(f"slurm job {job}: step {job}.0 not running after {timeout} s")

    def _step_tasks_started(self, job: str) -> bool:
        """Have all tasks of step <job>.0 exec'd? (a process whose own environment, set at exec, is
        the step's, and which is not slurmstepd; root sees the nodes' processes in /proc)."""
        info = self.run(["scontrol", "show", "step", f"{job}.0", "-o"]).stdout
        words = dict(w.split("=", 1) for w in info.split() if "=" in w)
        if not words.get("Tasks", "").isdigit():
            return False
        started = 0
        for pid in _pids_with_env_var(f"SLURM_JOB_ID={job}"):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if b"SLURM_STEP_ID=0" in env and comm != "slurmstepd":
                started += 1
        return started >= int(words["Tasks"])

    def wait_end(self, job: str, timeout: float = 180) -> int:
        """Wait until the job has left the queue; its exit code (the batch script's). `sbatch --wait`
        polls after 2, 10, 42 ... s, so a 12 s job would take 42 s; this polls every 0.2 s."""
        deadline = time.monotonic() + timeout
        while self.run(["squeue", "-h", "-j", job, "-o", "%i"]).stdout.strip():
            if time.monotonic() > deadline:
                raise TimeoutError(f"slurm job {job} still queued or running after {timeout} s")
            time.sleep(0.2)
        info = self.run(["scontrol", "show", "job", job, "-o"]).stdout
        code = dict(w.split("=", 1) for w in info.split() if "=" in w).get("ExitCode", "")
        if not code.split(":")[0].isdigit():
            raise RuntimeError(f"slurm job {job}: no exit code in scontrol's record: {info.strip()[:300]}")
        return int(code.split(":")[0])

    def cancel(self, job: str, wait: float = 15) -> None:
        """scancel the job and wait (up to `wait` s) until squeue no longer lists it."""
        self.run(["scancel", job])
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not self.run(["squeue", "-h", "-j", job, "-o", "%i"]).stdout.strip():
                return
            time.sleep(0.1)


def load_slurm(base: Path | None = None) -> SlurmRig:
    base = base or rig_base()
    conf = base / "slurm" / "etc" / "slurm.conf"
    nodes = load_nodes(base)
    gpus = 0
    if conf.exists():
        for line in conf.read_text().splitlines():
            if line.startswith("NodeName=") and "Gres=gpu:" in line:
                gpus = int(line.split("Gres=gpu:")[1].split()[0])
    return SlurmRig(conf=conf, env={**os.environ, "SLURM_CONF": str(conf)}, nodes=[n.name for n in nodes],
                    node_ips={n.name: n.ip for n in nodes}, gpus_per_node=gpus, base=base)


@pytest.fixture(scope="session")
def rig_slurm() -> SlurmRig:
    """The rig's Slurm cluster (brought up once per session, with the netns nodes it runs in)."""
    _require_parts("netns", "slurm")
    return load_slurm()


# ----------------------------------------------------------------------------- hung jobs


@dataclass
class HungJob:
    """A running gloo job whose ranks are stuck (see tests/rig/hung_worker.py)."""
    where: str                       # local | nodes | slurm
    ranks: dict[int, tuple[str, int]]  # rank -> (host, pid as that host sees it)
    root_pids: dict[int, int]          # rank -> pid in this (root) PID namespace: use it to kill
    launcher_pids: list[int]           # torchrun / nsenter / sbatch-side processes we started
    odd_rank: int | None
    odd_function: str
    mode: str
    marker_dir: Path
    token: str                         # value of $MLDEBUG_RIG_JOB in every process of the job
    log: Path                          # launcher output (torchrun), or the Slurm job's output file
    nodes: list[str] = field(default_factory=list)  # hosts the ranks run on
    master_addr: str = "127.0.0.1"
    job_id: str | None = None          # Slurm job id (where="slurm")
    info: dict[int, dict[str, object]] = field(default_factory=dict)  # each rank's marker
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)
    _slurm: SlurmRig | None = field(default=None, repr=False)

    @property
    def pids(self) -> list[int]:
        """Root-namespace pids of all ranks, by rank."""
        return [self.root_pids[r] for r in sorted(self.root_pids)]

    def alive(self) -> dict[int, bool]:
        """rank -> whether its process still runs (zombies count as dead)."""
        return {r: lifecycle.alive(p) for r, p in self.root_pids.items()}

    def processes(self) -> list[int]:
        """Root pids of every live process that belongs to this job (ranks, torchrun, srun...)."""
        return _pids_with_token(self.token)

    def kill(self, timeout: float = 15) -> None:
        """SIGKILL every rank (by pid) and the launchers, cancel the Slurm job; check none survive."""
        if self._slurm is not None and self.job_id:
            self._slurm.run(["scancel", "-s", "KILL", self.job_id])
        deadline = time.monotonic() + timeout
        while True:
            victims = set(self.processes()) | {p for p in self.root_pids.values() if lifecycle.alive(p)}
            victims |= {p.pid for p in self._procs if p.poll() is None}
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for p in self._procs:
                try:
                    p.wait(timeout=0.05)
                except subprocess.TimeoutExpired:
                    pass
            if not victims:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"hung job {self.token}: processes survive SIGKILL: {sorted(victims)}")
            time.sleep(0.1)
        if self._slurm is not None and self.job_id:
            self._slurm.cancel(self.job_id)


def _pids_with_token(token: str) -> list[int]:
    return _pids_with_env_var(f"{TOKEN_VAR}={token}")


def _pids_with_env_var(assignment: str) -> list[int]:
    """Live processes whose environment holds `assignment` (KEY=VALUE)."""
    needle = assignment.encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0") and lifecycle.alive(int(entry)):
            out.append(int(entry))
    return out


def _nspid(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except OSError:
        pass
    return []


def _root_pid_of(pidns_inode: int, local_pid: int, candidates: Sequence[int] | None = None) -> int | None:
    """Root pid of the process with pid `local_pid` in the PID namespace `pidns_inode`."""
    pool = candidates if candidates is not None else [int(e) for e in os.listdir("/proc") if e.isdigit()]
    for pid in pool:
        ns = _nspid(pid)
        if ns and ns[-1] == local_pid:
            try:
                if os.stat(f"/proc/{pid}/ns/pid").st_ino == pidns_inode:
                    return pid
            except OSError:
                continue
    return None


class _Launch:
    """Starts one hung job; `HungJob` is what the test gets back."""

    def __init__(self, tmp: Path, request: pytest.FixtureRequest) -> None:
        self.tmp = tmp
        self.request = request

    def __call__(self, nranks: int = 4, odd_rank: int | None = None, odd_function: str = "stuck_here",
                 mode: str = "hang", where: str = "local", nodes: int = 2, timeout: float = 120) -> HungJob:
        if mode not in ("hang", "loop"):
            raise ValueError(f"mode must be hang or loop, not {mode!r}")
        if where not in ("local", "nodes", "slurm"):
            raise ValueError(f"where must be local, nodes or slurm, not {where!r}")
        if not odd_function.isidentifier():
            raise ValueError(f"odd_function must be a Python identifier, not {odd_function!r}")
        if odd_rank is None:
            odd_rank = nranks - 1
        if not -1 <= odd_rank < nranks:
            raise ValueError(f"odd_rank {odd_rank} outside 0..{nranks - 1} (-1: no odd rank)")
        token = uuid.uuid4().hex[:12]
        marker_dir = self.tmp / f"hung-{token}"
        marker_dir.mkdir(parents=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", TOKEN_VAR: token, "HUNG_MARKER_DIR": str(marker_dir),
               "HUNG_ODD_RANK": str(odd_rank), "HUNG_ODD_FUNCTION": odd_function, "HUNG_MODE": mode,
               "PYTHONUNBUFFERED": "1"}
        for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
            env.pop(var, None)
        job = HungJob(where=where, ranks={}, root_pids={}, launcher_pids=[], odd_rank=odd_rank if odd_rank >= 0
                      else None, odd_function=odd_function, mode=mode, marker_dir=marker_dir, token=token,
                      log=marker_dir / "launcher.log")
        _jobs.append(job)
        torchrun = [sys.executable, "-m", "torch.distributed.run"]
        pidns: dict[str, int] = {}  # host -> PID namespace inode (netns nodes)
        if where == "local":
            job.nodes = [os.uname().nodename]
            with open(job.log, "wb") as log:
                p = subprocess.Popen([*torchrun, "--standalone", f"--nproc-per-node={nranks}", str(WORKER)],
                                     env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, cwd=marker_dir)
            job._procs.append(p)
            job.launcher_pids.append(p.pid)
        elif where == "nodes":
            all_nodes: list[NetnsNode] = self.request.getfixturevalue("rig_nodes")
            if not 1 <= nodes <= len(all_nodes) or nranks % nodes:
                raise ValueError(f"nodes={nodes}: need 1..{len(all_nodes)} nodes dividing nranks={nranks}")
            use = all_nodes[:nodes]
            job.nodes, job.master_addr = [n.name for n in use], use[0].ip
            port = rig_port()
            env["GLOO_SOCKET_IFNAME"] = "eth0"  # node names do not resolve; gloo would pick loopback
            with open(job.log, "wb") as log:
                for i, node in enumerate(use):
                    argv = [*torchrun, f"--nnodes={nodes}", f"--node-rank={i}",
                            f"--nproc-per-node={nranks // nodes}", f"--master-addr={use[0].ip}",
                            f"--master-port={port}", str(WORKER)]
                    p = subprocess.Popen(node.nsenter_argv(argv), env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, cwd=marker_dir)
                    job._procs.append(p)
                    job.launcher_pids.append(p.pid)
                    pidns[node.name] = node.pidns()
        else:
            slurm: SlurmRig = self.request.getfixturevalue("rig_slurm")
            if not 1 <= nodes <= len(slurm.nodes) or nranks % nodes:
                raise ValueError(f"nodes={nodes}: need 1..{len(slurm.nodes)} nodes dividing nranks={nranks}")
            use_names = slurm.nodes[:nodes]
            job.nodes, job.master_addr = use_names, slurm.node_ips[use_names[0]]
            env.update(SLURM_CONF=str(slurm.conf), GLOO_SOCKET_IFNAME="eth0", MASTER_ADDR=job.master_addr,
                       MASTER_PORT=str(rig_port()))
            job._slurm = slurm
            job.log = marker_dir / "slurm.out"
            job.job_id = slurm.sbatch([sys.executable, str(WORKER)], nodes=nodes,
                                      ntasks_per_node=nranks // nodes, env=env, output=job.log,
                                      extra=["-w", ",".join(use_names), "-J", f"hung-{token}"])
            for n in load_nodes(slurm.base):
                pidns[n.name] = os.stat(f"/proc/{n.init_pid}/ns/pid").st_ino
        self._wait_markers(job, nranks, timeout)
        for r, info in job.info.items():
            host, pid = str(info["host"]), int(info["pid"])  # type: ignore[arg-type]
            job.ranks[r] = (host, pid)
            if where == "local":
                job.root_pids[r] = pid
            else:
                root = _root_pid_of(pidns[host], pid, job.processes())
                if root is None:
                    raise RuntimeError(f"hung job: rank {r} ({host} pid {pid}) not found in this PID namespace")
                job.root_pids[r] = root
        self._wait_hang_points(job, timeout)
        return job

    @staticmethod
    def _wait_hang_points(job: HungJob, timeout: float) -> None:
        """Markers are written just before the hang point: wait until py-spy sees every rank there
        (the odd rank in its function, the others in all_reduce, or all in recv with no odd rank)."""
        from tests.conftest import main_thread_functions, py_spy, require

        require(py_spy(), "py-spy (to see every rank of a hung job reach its hang point)")
        other = "stuck_here" if job.odd_function == "load_batch" else "load_batch"
        want = {r: {"recv"} if job.odd_rank is None else {"all_reduce"} if r != job.odd_rank else
                {job.odd_function} if job.mode == "hang" else {job.odd_function, other} for r in job.root_pids}
        deadline = time.monotonic() + timeout
        waiting = dict(want)
        while waiting:
            for r in list(waiting):
                stack = main_thread_functions(job.root_pids[r])
                if stack and stack[0] in waiting[r]:
                    del waiting[r]
            if not waiting:
                return
            if time.monotonic() > deadline or any(p.poll() is not None for p in job._procs):
                seen = {r: main_thread_functions(job.root_pids[r]) for r in waiting}
                raise RuntimeError(f"hung job: ranks never reached their hang point: {seen} (want {want})")
            time.sleep(0.1)

    @staticmethod
    def _wait_markers(job: HungJob, nranks: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for r in range(nranks):
                if r not in job.info:
                    try:
                        job.info[r] = json.loads((job.marker_dir / f"rank{r}.json").read_text())
                    except (OSError, ValueError):
                        pass
            if len(job.info) == nranks:
                return
            dead = [p for p in job._procs if p.poll() is not None]
            gone = job._slurm is not None and job.job_id and not job._slurm.run(
                ["squeue", "-h", "-j", job.job_id, "-o", "%i"]).stdout.strip()
            if dead or gone or time.monotonic() > deadline:
                tail = job.log.read_text(errors="replace")[-3000:] if job.log.exists() else ""
                why = "launcher exited" if dead else "slurm job ended" if gone else f"timeout {timeout} s"
                raise RuntimeError(f"hung job did not come up ({why}); ranks ready: {sorted(job.info)}\n{tail}")
            time.sleep(0.1)


_jobs: list[HungJob] = []  # every job started in this session (the factory's teardown kills its own)


@pytest.fixture
def hung_job(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., HungJob]]:
    """Factory: start a hung gloo job; all its ranks are at their hang point when it returns.
    Teardown kills every rank by pid (and the launchers) and fails if any survives."""
    mine_from = len(_jobs)
    yield _Launch(tmp_path, request)
    errors = []
    for job in _jobs[mine_from:]:
        try:
            job.kill()
        except RuntimeError as e:
            errors.append(str(e))
    del _jobs[mine_from:]
    if errors:
        pytest.fail("; ".join(errors))


@pytest.fixture(scope="session", autouse=True)
def _rig_session_teardown() -> Iterator[None]:
    """With MLDEBUG_RIG_TEARDOWN=1, take the rig down at the end of the session (if it was used)."""
    yield
    if os.environ.get("MLDEBUG_RIG_TEARDOWN") == "1" and _part_errors:
        subprocess.run(["bash", str(RIG_DIR / "down.sh")], capture_output=True, text=True, timeout=120)
