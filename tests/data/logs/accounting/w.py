import os, sys, time
rank = int(os.environ["RANK"])
print(f"step 0 on rank {rank}", flush=True)
if rank == int(os.environ.get("BAD", "1")):
    time.sleep(0.5)
    raise ValueError(f"bad batch on rank {rank}")
time.sleep(30)
# ruff: noqa  (kept as run: the consoles' tracebacks name its line numbers)
