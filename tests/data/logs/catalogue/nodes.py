"""How node-lost-node1.log and node-lost-node2.log were made (torch 2.13, CPU, gloo; the rig's two network-namespace
nodes, tests/rig/up.sh; the same code first ran as /tmp/nodeloss/train.py, the path its frames show): one torchrun
agent per node, 2 ranks each, then node2 lost at once (its agent and its ranks killed by SIGKILL, as a node that
loses power), while node1's ranks were in an all_reduce:

    # on node1, then node2 (N = 1, 2; is_host=1 on node1 only, where the rendezvous store lives)
    GLOO_SOCKET_IFNAME=eth0 torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 10.213.7.11:29556 \\
        --rdzv-id nodeloss --rdzv-conf is_host=$((N == 1)) --local-addr 10.213.7.1N nodes.py > node-lost-nodeN.log 2>&1
    kill -9 AGENT_ON_NODE2 RANKS_ON_NODE2   # after ~20 s

node1's ranks each lose their connection to node2's address (gloo's "Read error [10.213.7.12]:29883: Connection reset
by peer"), and its agent reports them; node2's console just stops.
"""

import os
import socket
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} of {dist.get_world_size()} on {socket.gethostname()} (pid {os.getpid()})", flush=True)
t = torch.ones(1000)
for step in range(1, 10_000):
    dist.all_reduce(t)
    if step % 10 == 0:
        print(f"rank {rank}: step {step}", flush=True)
    time.sleep(0.05)
