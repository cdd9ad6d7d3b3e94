"""Who am I in the job: rank, world size, node and master, from whichever launcher started us.

Pure functions over an environment mapping (no torch import), so every launcher's variables can be
tested without that launcher. The shell equivalent is reading ``env | grep -E 'RANK|SLURM_|OMPI_|PMI_'``.
"""

from __future__ import annotations

import os
import re
import socket
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from ml_debug.core.errors import UsageError

LAUNCHERS = ("torchrun", "slurm", "mpi", "single")
DEFAULT_PORT = 29500


@dataclass(frozen=True)
class World:
    """This process's place in the job, whatever launched it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    host: str
    master_addr: str | None  # None: the launcher did not say and it cannot be derived (multi-node MPI)
    master_port: int
    launcher: str  # one of LAUNCHERS

    @property
    def label(self) -> str:
        """``[host:rank]``, the prefix every per-rank line carries."""
        return f"[{self.host}:{self.rank}]"

    @property
    def nnodes(self) -> int:
        return max(1, -(-self.world_size // max(1, self.local_world_size)))


def _opt_int(env: Mapping[str, str], *names: str) -> int | None:
    """The first of ``names`` that is set, as an integer; None when none is."""
    for name in names:
        value = env.get(name, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                raise UsageError(f"{name}={value!r} is not an integer",
                                 f"fix or unset {name} in the job's environment") from None
    return None


def _int(env: Mapping[str, str], *names: str, default: int) -> int:
    value = _opt_int(env, *names)
    return default if value is None else value


def _need_int(env: Mapping[str, str], *names: str) -> int:
    value = _opt_int(env, *names)
    if value is None:
        raise UsageError(f"{' or '.join(names)} is not set", "the launcher sets it: check the job's environment")
    return value


def _host(env: Mapping[str, str]) -> str:
    # SLURMD_NODENAME is the node's name as Slurm knows it (fake nodes share one kernel hostname).
    return env.get("SLURMD_NODENAME") or socket.gethostname()


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist: ``node[07-09,12],gpu1`` -> ``node07``.

    Same as ``scontrol show hostnames "$SLURM_STEP_NODELIST" | head -n1`` without needing scontrol.
    """
    nodelist = nodelist.strip()
    if not nodelist:
        raise UsageError("empty Slurm node list", "is SLURM_STEP_NODELIST set by srun?")
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):  # the first top-level comma ends the first item
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            end = i
            break
    item = nodelist[:end]
    # Expand only each bracket's first range start: "n[3-5]-ib[1,2]" -> "n3-ib1".
    return re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m.group(1))[0], item)


def slurm_tasks_per_node(spec: str, node_id: int) -> int | None:
    """Tasks on node ``node_id`` from ``SLURM_STEP_TASKS_PER_NODE`` syntax: ``2(x3),1``."""
    index = 0
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            return None
        count, repeat = int(m.group(1)), int(m.group(2) or 1)
        if node_id < index + repeat:
            return count
        index += repeat
    return None


def derived_port(job_id: str, step_id: str = "0") -> int:
    """A port every task of one Slurm step derives alike (20000-39999), different per job and step."""
    return 20000 + zlib.crc32(f"{job_id}.{step_id}".encode()) % 20000


def is_launched(environ: Mapping[str, str] | None = None) -> bool:
    """True when torchrun, srun (a step task) or mpirun started this process."""
    env = os.environ if environ is None else environ
    return _launcher(env) != "single"


def _launcher(env: Mapping[str, str]) -> str:
    if env.get("RANK") and env.get("WORLD_SIZE"):
        return "torchrun"  # also plain env:// worlds set by hand
    if env.get("OMPI_COMM_WORLD_RANK") or env.get("PMI_RANK") or env.get("PMIX_RANK"):
        return "mpi"
    # Inside an sbatch script SLURM_PROCID=0 too, but that is one process, not a task of a step.
    if env.get("SLURM_PROCID") and (env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")) \
            and env.get("SLURM_STEP_NODELIST", env.get("SLURM_NODELIST")):
        return "slurm"
    return "single"


def detect_world(environ: Mapping[str, str] | None = None) -> World:
    """Read the world from the launcher's variables (torchrun, srun, mpirun/PMI) or a single process."""
    env = os.environ if environ is None else environ
    launcher = _launcher(env)
    host = _host(env)
    port = _opt_int(env, "MASTER_PORT")
    addr = env.get("MASTER_ADDR") or None

    if launcher == "torchrun":
        rank = _need_int(env, "RANK")
        size = _need_int(env, "WORLD_SIZE")
        local_rank = _int(env, "LOCAL_RANK", default=0)
        local_size = _int(env, "LOCAL_WORLD_SIZE", default=size)
        known_node = _opt_int(env, "GROUP_RANK", "NODE_RANK")
        node_rank = rank // max(1, local_size) if known_node is None else known_node
        world = World(rank, size, local_rank, local_size, node_rank, host,
                      addr or "127.0.0.1", port or DEFAULT_PORT, launcher)
    elif launcher == "slurm":
        rank = _need_int(env, "SLURM_PROCID")
        size = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", default=1)
        local_rank = _int(env, "SLURM_LOCALID", default=0)
        node_rank = _int(env, "SLURM_NODEID", default=0)
        spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
        from_spec = slurm_tasks_per_node(spec, node_rank) if spec else None
        local_size = _int(env, "SLURM_NTASKS_PER_NODE", default=size) if from_spec is None else from_spec
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST") or ""
        if not addr:
            addr = first_host(nodelist)
        if port is None:
            port = derived_port(env.get("SLURM_JOB_ID", env.get("SLURM_JOBID", "0")),
                                env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", "0")))
        world = World(rank, size, local_rank, local_size, node_rank, host, addr, port, launcher)
    elif launcher == "mpi":
        rank = _need_int(env, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
        size = _int(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", default=1)
        known_local = _opt_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PALS_LOCAL_RANKID")
        known_size = _opt_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PALS_LOCAL_SIZE")
        if known_local is None or known_size is None:  # assume one node: the only safe guess
            local_rank, local_size = rank, size
        else:
            local_rank, local_size = known_local, known_size
        node_rank = rank // max(1, local_size)
        if not addr and local_size == size:
            addr = "127.0.0.1"  # every rank on this node; multi-node needs MASTER_ADDR
        world = World(rank, size, local_rank, local_size, node_rank, host, addr,
                      port or DEFAULT_PORT, launcher)
    else:
        world = World(0, 1, 0, 1, 0, host, addr or "127.0.0.1", port or DEFAULT_PORT, "single")
    _validate(world)
    return world


def _validate(w: World) -> None:
    if w.world_size < 1 or not 0 <= w.rank < w.world_size:
        raise UsageError(f"rank {w.rank} is outside a world of {w.world_size} ({w.launcher} variables)",
                         "check RANK/WORLD_SIZE (or SLURM_PROCID/SLURM_NTASKS, OMPI_COMM_WORLD_*)")
    if w.local_world_size < 1 or not 0 <= w.local_rank < w.local_world_size:
        raise UsageError(f"local rank {w.local_rank} is outside {w.local_world_size} local ranks "
                         f"({w.launcher} variables)", "check LOCAL_RANK/LOCAL_WORLD_SIZE")
    if not 0 < w.master_port < 65536:
        raise UsageError(f"MASTER_PORT {w.master_port} is not a valid port", "use a port in 1024-65535")
