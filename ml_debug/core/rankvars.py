"""The launcher variables that say which rank a process is: one list for every part of mldebug.

Dependency-free (user code imports printflock and nicertrace, which read them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# First variable found wins: torchrun's RANK is the global rank even under srun/mpirun.
RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
WORLD_SIZE_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
# torchrun's own variables; srun's and mpirun's are recognised by their prefixes.
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "NODE_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_COMM_WORLD_", "PMI_", "PMIX_", "MV2_")


def rank_from_env(environ: Mapping[str, str] | None = None) -> tuple[int, str] | None:
    """(rank, the variable it came from), or None when no launcher set one."""
    env = os.environ if environ is None else environ
    for name in RANK_VARS:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value), name
    return None
