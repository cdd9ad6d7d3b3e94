"""gpu-test: time to a verdict for 4 local CPU ranks against the seed's torch-distributed-gpu-test.py
adapted to gloo (same world, same machine, one run), and time to name a missing rank against the
stage timeout (the seed has no timeout: it waits 30 minutes or forever).

The stored seed lost its indentation, so its logic is restated here (init, all_reduce of a one,
barrier, "is OK" print, barrier) with gloo/CPU in place of NCCL/CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import Result

SEED_GLOO = """
import os, socket, torch, torch.distributed as dist
local_rank = int(os.environ["LOCAL_RANK"])
gpu = f"[{socket.gethostname()}-{local_rank}]"
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
t = torch.ones(1)
dist.all_reduce(t, op=dist.ReduceOp.SUM)
dist.barrier()
print(f"{gpu} Reduction op=sum result: {t.item()}")
torch.ones(1)
print(f"{gpu} is OK (global rank: {rank}/{world_size})")
dist.barrier()
if rank == 0:
    print(f"pt={torch.__version__}")
"""


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MLDEBUG_WIDTH": "160"}


def _timed(argv: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    rc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=_env()).returncode
    return time.perf_counter() - t0, rc


def run() -> list[Result]:
    py = sys.executable
    torchrun = str(Path(py).parent / "torchrun")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "seed_gloo.py"
        script.write_text(SEED_GLOO)
        seed_s, seed_rc = _timed([torchrun, "--nproc-per-node", "4", str(script)])
        ours_s, ours_rc = _timed([py, "-m", "ml_debug", "gpu-test", "--nproc-per-node", "4", "--stage-timeout", "30"])
        # a world of 3 where only ranks 0 and 1 start: how long until both have named rank 2 and exited
        timeout = 5.0
        port = str(29000 + os.getpid() % 1000)
        t0 = time.perf_counter()
        procs = [subprocess.Popen([py, "-m", "ml_debug", "gpu-test", "--json", "--stage-timeout", str(timeout)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env={**_env(), "RANK": str(r), "WORLD_SIZE": "3", "LOCAL_RANK": str(r),
                                       "LOCAL_WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
                 for r in range(2)]
        codes = [p.wait(timeout=300) for p in procs]
        missing_s = time.perf_counter() - t0
    return [
        Result("gpu-test 4 CPU ranks vs seed (gloo)", ours_s / seed_s,
               f"mldebug {ours_s:.1f}s (rc {ours_rc}, 9 checked stages) vs seed {seed_s:.1f}s (rc {seed_rc}, "
               "1 unchecked all_reduce)"),
        Result("gpu-test missing rank: time / stage timeout", missing_s / timeout,
               f"named rank 2 and exited in {missing_s:.1f}s with --stage-timeout {timeout:g} (rc {codes}); "
               "the seed waits for its 30 min default"),
    ]
