"""How node-raise-node1.log and node-raise-node2.log were made (torch 2.13, CPU, gloo; the rig's two network-namespace
nodes; the same code first ran as /tmp/n2raise/train.py, the path its frames show): one torchrun agent per node, 2
ranks each, as nodes.py says, and rank 3 (on node2) raises at step 40. node1's console alone holds only its ranks'
lost connections to node2's address; with node2's, rank 3's exception is the cause.
"""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(100)
for step in range(1, 1000):
    if rank == 3 and step == 40:
        raise RuntimeError(f"rank {rank}: loss spiked at step {step}")
    dist.all_reduce(t)
    time.sleep(0.05)
