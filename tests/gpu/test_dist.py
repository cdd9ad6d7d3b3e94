"""ml_debug.dist on real GPUs: the NCCL group is created eagerly (bound to the rank's GPU, the NCCL
communicator up before init_process_group returns, so a broken GPU or fabric fails at init and not
at the first collective), a collective and the teardown work, and init gives up on a missing rank
within its timeout. Marked gpu: skipped without one.

    pytest -m gpu tests/gpu/test_dist.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, reserved_port
from tests.gpu.support import need_gpus, repo_env

pytestmark = pytest.mark.gpu

# Each rank: init through mldebug, then look, before any collective, for NCCL's own record of its
# communicator (its debug file is line-buffered, so the line is there once init returned).
WORKER = r'''
import glob, json, os
from ml_debug.dist.device import choose_device
from ml_debug.dist.world import detect_world
from ml_debug.dist.group import init_process_group, teardown

world = detect_world()
choice = choose_device(world)
init_process_group(world, choice, 60)
import torch
import torch.distributed as dist

log = "".join(open(p).read() for p in glob.glob(os.environ["NCCL_DEBUG_FILE"].replace("%p", str(os.getpid()))))
pg = dist.distributed_c10d._get_default_group()
report = {"rank": world.rank, "device": choice.device, "backend": dist.get_backend(),
          "bound": str(pg.bound_device_id), "eager": "Init COMPLETE" in log,
          "current": torch.cuda.current_device()}
t = torch.full((1024,), float(world.rank + 1), device=choice.device)
dist.all_reduce(t)
n = world.world_size
report["sum_ok"] = bool((t == n * (n + 1) / 2).all().item())
report["clean_teardown"] = teardown(timeout_s=30)
print("RESULT " + json.dumps(report), flush=True)
'''


def test_nccl_group_is_initialised_eagerly_on_each_ranks_own_gpu(tmp_path: Path) -> None:
    n = need_gpus(1)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, **repo_env(), "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT",
           "NCCL_DEBUG_FILE": str(tmp_path / "nccl.%p.log"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           str(n), str(script)], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    reports = sorted((json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")),
                     key=lambda r: r["rank"])
    assert proc.returncode == 0 and len(reports) == n, proc.stderr[-4000:]
    for r in reports:
        assert r["backend"] == "nccl" and r["device"] == f"cuda:{r['rank']}", r
        assert r["bound"] == r["device"] and r["current"] == r["rank"], r
        assert r["eager"], f"rank {r['rank']}: no NCCL communicator right after init (lazy init?): {r}"
        assert r["sum_ok"] and r["clean_teardown"], r


def test_nccl_init_gives_up_on_a_missing_rank_within_its_timeout() -> None:
    need_gpus(1)
    # A world of 2 where only rank 0 starts: init must end with exit 4 (PartialResult), not wait.
    code = ("from ml_debug.dist.device import choose_device\n"
            "from ml_debug.dist.world import detect_world\n"
            "from ml_debug.dist.group import init_process_group\n"
            "from ml_debug.core.errors import PartialResult\n"
            "w = detect_world()\n"
            "try:\n    init_process_group(w, choose_device(w), 5)\n"
            "except PartialResult as e:\n    print('PARTIAL', e.message, e.hint, flush=True); raise SystemExit(4)\n")
    with reserved_port() as port:  # rank 0 listens there; nobody else can take it meanwhile
        env = {**os.environ, **repo_env(), "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        # The subprocess timeout is the hang guard: NCCL's own default would wait 10 minutes.
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                              cwd=REPO)
    assert proc.returncode == 4 and "PARTIAL" in proc.stdout, (proc.stdout, proc.stderr[-3000:])
    assert "(nccl, 127.0.0.1:" in proc.stdout and "timed out after 5 s" in proc.stdout, proc.stdout
