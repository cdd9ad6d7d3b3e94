"""Find the processes of a training job on this node and label them with their rank.

``find_targets`` walks launcher trees (torchrun, deepspeed, accelerate, srun/slurmstepd,
mpirun), or takes ``--pid`` / ``--pattern`` / ``--user``, or the processes holding a GPU;
``labels_from_environ`` reads RANK, LOCAL_RANK, WORLD_SIZE, SLURM_PROCID, OMPI ranks.
"""

from __future__ import annotations

from ml_debug.procs.find import FoundProcess, TargetSet, find_targets
from ml_debug.procs.labels import RankLabels, labels_from_environ, read_environ

__all__ = ["RankLabels", "FoundProcess", "TargetSet", "find_targets", "labels_from_environ", "read_environ"]
