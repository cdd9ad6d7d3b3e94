"""How the consoles of a job that torchrun restarted were made (torch 2.13, CPU, this machine; the same code first
ran as /tmp/restart/job2.py, the path their frames show):

    LOGLEVEL=INFO torchrun --standalone --nproc-per-node 2 --max-restarts 2 restart.py > restart-recovered.log 2>&1
    torchrun --standalone --nproc-per-node 2 --max-restarts 2 restart.py > restart-failed.log 2>&1

restart-recovered-default.log is restart-recovered.log without the agent's INFO lines (glog's "I1128 ..."), which
torchrun's default level does not print: the console of the same job at that level.

Rank 1 fails in the first attempt only. At LOGLEVEL=INFO the agent says it restarts the workers and, later, that
they finished: the job recovered (exit code 0). At torchrun's default level it says neither; in that run the
restarted ranks could not connect (gloo's connectFullMesh found the first attempt's address), so every attempt
failed and the job did (exit code 1).
"""

import os

import torch.distributed as dist

rank = int(os.environ["RANK"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
print(f"rank {rank} attempt {attempt}: loading shard", flush=True)
if attempt == 0 and rank == 1:
    raise RuntimeError("flaky data shard: checksum mismatch")
dist.init_process_group("gloo")
dist.barrier()
print(f"rank {rank} attempt {attempt}: done", flush=True)
dist.destroy_process_group()
