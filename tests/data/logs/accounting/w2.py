import os, sys, time
rank = int(os.environ["RANK"])
print(f"step 0 on rank {rank}", flush=True)
if rank == int(os.environ.get("BAD", "3")):
    time.sleep(float(os.environ.get("DELAY", "2")))
    raise ValueError(f"bad batch on rank {rank}")
time.sleep(20)
# ruff: noqa  (kept as run: the consoles' tracebacks name its line numbers)
