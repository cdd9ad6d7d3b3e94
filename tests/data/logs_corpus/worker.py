"""A tiny gloo job for the `mldebug logs` corpus: rank CORPUS_RANK fails, the others wait for it.

Its rank and world come from whichever launcher started it: torchrun/Accelerate/DeepSpeed (RANK,
WORLD_SIZE), srun (SLURM_PROCID, SLURM_NTASKS), Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE)
or pdsh (CORPUS_NODE_RANK x CORPUS_PROCS + local index, given on its command line). CORPUS_RANK=all: every
rank fails, at the same step. CORPUS_FAULT:
``raise`` (a ValueError), ``segv`` (SIGSEGV: exit code -11, no traceback), ``oom`` (the message of
CUDA's allocator, raised as torch.OutOfMemoryError), ``bus`` (a DataLoader worker killed by SIGBUS), ``kill``
(a single process logs a line and is killed by SIGKILL, as the OOM killer does, before it joins any group),
``sleep`` (for 300 s, until its launcher stops it).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def _ids() -> tuple[int, int]:
    for r, w in (("RANK", "WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("SLURM_PROCID", "SLURM_NTASKS")):
        if r in os.environ:
            return int(os.environ[r]), int(os.environ[w])
    raise SystemExit("no rank in the environment")


class _Bus(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        os.kill(os.getpid(), signal.SIGBUS)
        return i


def main() -> None:
    if os.environ.get("CORPUS_FAULT") == "kill":  # one process, killed (the OOM killer's SIGKILL) after a log line
        logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(levelname)s] %(message)s")
        logging.info("loading shard 7 of 9")
        os.kill(os.getpid(), signal.SIGKILL)
    rank, world = _ids()
    culprit = rank if os.environ.get("CORPUS_RANK") == "all" else int(os.environ.get("CORPUS_RANK", "1"))
    fault = os.environ.get("CORPUS_FAULT", "raise")
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    t = torch.ones(4)
    dist.all_reduce(t)
    print(f"rank {rank}: step 1 done (sum {int(t[0])})", flush=True)
    if rank == culprit:
        time.sleep(0.2)
        if fault == "sleep":  # until the launcher stops it
            time.sleep(300)
        if fault == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if fault == "oom":
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.15 GiB of which "
                "1.02 GiB is free. Process 4242 has 78.12 GiB memory in use.")
        if fault == "bus":
            for _ in torch.utils.data.DataLoader(_Bus(), num_workers=1):
                pass
        raise ValueError(f"bad batch on rank {rank}: shape mismatch")
    dist.all_reduce(t)
    print(f"rank {rank}: step 2 done", flush=True)
    dist.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
