"""A gloo job that leaves Flight Recorder dump files the way NCCL's dump on timeout writes them.

Each rank issues FR_STEPS all_reduces; then, by FR_FAULT:

- ``desync``: rank FR_ODD issues a broadcast where the others issue the next all_reduce;
- ``missing``: rank FR_ODD never issues the last all_reduce, which the others issue.

The collectives of that last step never complete (gloo has no watchdog to abort them): every rank
waits in a thread with a short timeout, then writes its Flight Recorder as NCCL would on a timeout,
``torch._C._distributed_c10d._dump_fr_trace(True, False, False)`` (a pickle), to
``$FR_DUMP_PREFIX<rank>`` (TORCH_FR_DUMP_TEMP_FILE's naming), and leaves with os._exit: nothing
waits on the hung collective. Environment: TORCH_FR_BUFFER_SIZE>0 (set by the test), FR_DUMP_PREFIX,
FR_FAULT, FR_ODD (1), FR_STEPS (5): the odd collective is #FR_STEPS+1.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta

import torch
import torch.distributed as dist


def dump(prefix: str, rank: int) -> None:
    data = vars(torch._C._distributed_c10d)["_dump_fr_trace"](True, False, False)
    path = f"{prefix}{rank}"
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def wait_quietly(work: dist.Work) -> None:
    try:
        work.wait(timedelta(seconds=3))
    except Exception:  # the timeout this job is made for
        pass


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    odd = int(os.environ.get("FR_ODD", "1"))
    fault = os.environ["FR_FAULT"]
    t = torch.ones(16)
    for _ in range(int(os.environ.get("FR_STEPS", "5"))):
        dist.all_reduce(t)
    if rank == odd and fault == "desync":
        work = dist.broadcast(t, src=rank, async_op=True)
    elif rank == odd and fault == "missing":
        work = None
    else:
        work = dist.all_reduce(t, async_op=True)
    if work is not None:
        last = threading.Thread(target=wait_quietly, args=(work,), daemon=True)
        last.start()
        last.join(5)
    else:
        import time

        time.sleep(3)
    dump(os.environ["FR_DUMP_PREFIX"], rank)
    os._exit(0)


if __name__ == "__main__":
    main()
