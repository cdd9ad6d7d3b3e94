"""A gloo job with Flight Recorder on: a few all_reduces, then rank 1 stops issuing collectives
(it sleeps in `odd_one_out`) while the other ranks block in the next all_reduce.

Environment: TORCH_FR_BUFFER_SIZE>0 and MLDEBUG_FR_DIR (set by the test at launch); FR_MARKER_DIR
where each rank writes rank<R>.json just before its hang point; FR_STEPS all_reduces before (3).
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import ml_debug.flight_recorder


def odd_one_out() -> None:
    while True:
        time.sleep(3600)


def main() -> None:
    ml_debug.flight_recorder.enable()
    dist.init_process_group("gloo", timeout=timedelta(seconds=3600))
    rank = dist.get_rank()
    t = torch.ones(16)
    for _ in range(int(os.environ.get("FR_STEPS", "3"))):
        dist.all_reduce(t)
    marker = os.path.join(os.environ["FR_MARKER_DIR"], f"rank{rank}.json")
    with open(marker + ".tmp", "w") as f:
        json.dump({"rank": rank, "pid": os.getpid()}, f)
    os.replace(marker + ".tmp", marker)
    if rank == 1:
        odd_one_out()
    dist.all_reduce(t)


if __name__ == "__main__":
    main()
