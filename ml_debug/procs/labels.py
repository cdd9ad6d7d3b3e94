"""Which rank is a process? Read its launcher variables from /proc/PID/environ."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ml_debug.core.rankvars import LOCAL_RANK_VARS, RANK_VARS, WORLD_SIZE_VARS

KEPT_VARS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "ROLE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
    "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "CUDA_VISIBLE_DEVICES", "MLDEBUG_FR_DIR", "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE",
)


@dataclass
class RankLabels:
    """A process's place in the job, as its launcher told it."""

    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    group_rank: int | None = None
    rank_source: str | None = None  # the variable the rank came from
    env: dict[str, str] = field(default_factory=dict)  # the launcher variables that were set


def read_environ(pid: int) -> dict[str, str] | None:
    """The environment a process started with (`tr '\\0' '\\n' < /proc/PID/environ`); None if unreadable."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _int(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[int | None, str | None]:
    for name in names:
        value = env.get(name, "").strip()
        if value.lstrip("-").isdigit():
            return int(value), name
    return None, None


def labels_from_environ(env: Mapping[str, str] | None) -> RankLabels:
    """Rank, local rank, world size and group rank from launcher variables."""
    if not env:
        return RankLabels()
    rank, source = _int(env, RANK_VARS)
    local_rank, _ = _int(env, LOCAL_RANK_VARS)
    world, _ = _int(env, WORLD_SIZE_VARS)
    group, _ = _int(env, ("GROUP_RANK", "NODE_RANK", "SLURM_NODEID"))
    kept = {k: env[k] for k in KEPT_VARS if k in env}
    return RankLabels(rank=rank, local_rank=local_rank, world_size=world, group_rank=group,
                      rank_source=source, env=kept)
