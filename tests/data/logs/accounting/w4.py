import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"step 0 on rank {rank}", flush=True)
time.sleep(0.5)
raise ValueError(f"bad batch on rank {rank}")
# ruff: noqa  (kept as run: the consoles' tracebacks name its line numbers)
