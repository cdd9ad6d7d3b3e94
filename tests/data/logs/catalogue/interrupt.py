"""How torchrun-ctrl-c.log was made (torch 2.13, CPU, gloo, this machine; the same code first ran as /tmp/real2/loop.py,
the path its frames show): a job training along, then SIGINT to torchrun, as Ctrl-C in its terminal sends:

    setsid torchrun --nproc-per-node 2 interrupt.py > torchrun-ctrl-c.log 2>&1 &
    sleep 12; pkill -INT -f "torchrun --nproc-per-node 2 interrupt.py"

torchrun's agent says "Received 2 death signal, shutting down workers", sends its workers SIGINT (their
KeyboardInterrupt tracebacks), and ends with its own SignalException traceback.
"""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(10)
for step in range(100000):
    dist.all_reduce(t)
    if step % 50 == 0:
        print(f"rank {dist.get_rank()} step {step}", flush=True)
    time.sleep(0.01)
