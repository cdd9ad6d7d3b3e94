import datetime, os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
r = dist.get_rank()
mode = os.environ["MODE"]
if mode == "barrier":
    if r == 0:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=2))
    else:
        time.sleep(6)
else:
    if r == 0:
        t = torch.zeros(1); dist.recv(t, 1)
    else:
        time.sleep(6)
# ruff: noqa  (kept as run)
