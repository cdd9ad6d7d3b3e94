"""Find the processes of a training job on this node and label them with their rank.

``find_processes`` walks launcher trees (torchrun, deepspeed, accelerate, srun/slurmstepd,
mpirun), or takes ``--pid`` / ``--pattern`` / ``--user``, or the processes holding a GPU;
``labels_from_environ`` reads RANK, LOCAL_RANK, WORLD_SIZE, SLURM_PROCID, OMPI ranks.
"""

from __future__ import annotations

from ml_debug.procs.find import FoundProcess, FoundProcesses, find_processes
from ml_debug.procs.labels import RankLabels, labels_from_environ, read_environ

__all__ = ["RankLabels", "FoundProcess", "FoundProcesses", "find_processes", "labels_from_environ", "read_environ"]
