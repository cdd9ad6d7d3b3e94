"""A deliberately hung multi-rank gloo job, for the diagnostics tools to look at.

Started by torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or by srun
(SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, with MASTER_ADDR/MASTER_PORT in the environment).

Environment it reads:
  HUNG_MARKER_DIR     where each rank writes rank<R>.json ({rank, pid, host, ...}) just before it
                      reaches its hang point (required)
  HUNG_ODD_RANK       the odd rank (-1: none; default: the last rank)
  HUNG_ODD_FUNCTION   name of the function the odd rank sits in (default stuck_here); any Python
                      identifier: the function is made at run time under that name
  HUNG_MODE           hang: the odd rank sleeps forever inside HUNG_ODD_FUNCTION
                      loop: the odd rank keeps calling HUNG_ODD_FUNCTION and load_batch (or
                            stuck_here, when the odd function is load_batch) in turn, 0.2 s each,
                            so its stack changes between samples
  HUNG_TIMEOUT_S      process group timeout (default 3600: it hangs until killed)

Every rank first runs one all_reduce (so all of them really are connected), then the normal ranks
call all_reduce again and block there, waiting for the odd rank that never comes. With no odd
rank (HUNG_ODD_RANK=-1) every rank blocks in dist.recv from its right neighbour, which never sends.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import types
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist


def _sleep_forever() -> None:
    while True:
        time.sleep(3600)


def _sleep_a_little() -> None:
    time.sleep(0.2)


def named(template: Callable[[], None], name: str) -> Callable[[], None]:
    """A copy of `template` whose code object is called `name`, so py-spy/gdb show that name."""
    if not name.isidentifier():
        raise SystemExit(f"hung_worker: HUNG_ODD_FUNCTION={name!r} is not a Python identifier")
    code = template.__code__.replace(co_name=name)
    if sys.version_info >= (3, 11):
        code = code.replace(co_qualname=name)
    return types.FunctionType(code, template.__globals__, name)


def world() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's or srun's variables."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))
    if "SLURM_PROCID" in os.environ:
        return (int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"]),
                int(os.environ.get("SLURM_LOCALID", "0")))
    raise SystemExit("hung_worker: run me under torchrun or srun")


def write_marker(directory: str, info: dict[str, object]) -> None:
    path = os.path.join(directory, f"rank{info['rank']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(info, f)
    os.replace(path + ".tmp", path)  # atomic: the fixture never reads half a file


def main() -> None:
    rank, world_size, local_rank = world()
    marker_dir = os.environ["HUNG_MARKER_DIR"]
    odd_rank = int(os.environ.get("HUNG_ODD_RANK", str(world_size - 1)))
    odd_name = os.environ.get("HUNG_ODD_FUNCTION", "stuck_here")
    mode = os.environ.get("HUNG_MODE", "hang")
    timeout = float(os.environ.get("HUNG_TIMEOUT_S", "3600"))
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world_size))

    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout))
    t = torch.ones(4)
    dist.all_reduce(t)  # everybody is connected
    assert int(t[0]) == world_size

    info: dict[str, object] = {
        "rank": rank, "world_size": world_size, "local_rank": local_rank, "pid": os.getpid(),
        "host": socket.gethostname(), "odd_rank": odd_rank, "odd_function": odd_name, "mode": mode,
        "master": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }
    write_marker(marker_dir, info)

    if odd_rank < 0:
        dist.recv(torch.zeros(4), src=(rank + 1) % world_size)  # nobody sends: all block
    elif rank != odd_rank:
        dist.all_reduce(t)  # blocks: the odd rank never joins
    elif mode == "loop":
        other = "stuck_here" if odd_name == "load_batch" else "load_batch"
        first, second = named(_sleep_a_little, odd_name), named(_sleep_a_little, other)
        step = 0
        while True:
            first() if step % 2 == 0 else second()
            step += 1
    else:
        named(_sleep_forever, odd_name)()


if __name__ == "__main__":
    main()
