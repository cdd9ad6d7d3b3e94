import os, sys, time
rank = int(os.environ["RANK"])
print(f"step 0 on rank {rank}", flush=True)
bad = dict(kv.split(":") for kv in os.environ["BAD"].split(","))
if str(rank) in bad:
    time.sleep(float(bad[str(rank)]))
    raise ValueError(f"bad batch on rank {rank}")
time.sleep(20)
# ruff: noqa  (kept as run: the consoles' tracebacks name its line numbers)
