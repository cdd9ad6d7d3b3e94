"""The corpus worker under torch.multiprocessing.spawn on one node: process i is rank i of 3 (CORPUS_RANK and
CORPUS_FAULT as in worker.py). mp.spawn's own traceback reports how the first process it saw end failed.
CORPUS_FAULT=raise-alone: no process group, the culprit raises while the others sleep (so it ends first)."""

from __future__ import annotations

import os
import sys
import time

import torch.multiprocessing as mp


def _rank(index: int, world: int, port: str) -> None:
    if os.environ.get("CORPUS_FAULT") == "raise-alone":
        time.sleep(0.5)
        if index == int(os.environ["CORPUS_RANK"]):
            raise ValueError(f"bad batch on process {index}: shape mismatch")
        time.sleep(30)
    os.environ.update(RANK=str(index), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    import worker  # beside this file: the spawned process has the same sys.path

    worker.main()


if __name__ == "__main__":
    mp.spawn(_rank, args=(3, sys.argv[1]), nprocs=3)
