"""A tiny gloo job whose rank LOGS_RANK fails on purpose, for `mldebug logs` to diagnose.

Started by torchrun (RANK, WORLD_SIZE) or by srun (SLURM_PROCID, SLURM_NTASKS, with MASTER_ADDR and
MASTER_PORT in the environment). Every rank joins one all_reduce (so all are connected), prints a
line, then:

- rank LOGS_RANK does LOGS_FAULT: ``raise`` (an uncaught ValueError with a traceback) or ``sigkill``
  (it kills itself with SIGKILL: no traceback, no message);
- every other rank enters a second all_reduce, which fails when that peer is gone ("Connection
  closed by peer"), unless torchrun stops it first (SIGTERM).
"""

from __future__ import annotations

import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    if "RANK" in os.environ:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    else:
        rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    culprit = int(os.environ.get("LOGS_RANK", "2"))
    fault = os.environ.get("LOGS_FAULT", "raise")
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    t = torch.ones(4)
    dist.all_reduce(t)
    print(f"rank {rank}: step 1 done (sum {int(t[0])})", flush=True)
    if rank == culprit:
        if fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise ValueError(f"bad batch on rank {rank}: shape mismatch")
    dist.all_reduce(t)
    print(f"rank {rank}: step 2 done", flush=True)
    dist.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
