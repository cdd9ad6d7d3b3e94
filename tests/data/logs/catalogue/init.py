"""How the consoles of processes that could not start their part were made (torch 2.13, CPU, this machine; the same
code first ran as /tmp/lines/real.py, the path their frames show):

    python init.py inuse  > port-in-use.log 2>&1        # the store's port held by another socket
    python init.py client > store-unreachable.log 2>&1  # a client store, nothing listening on its port
    python init.py server > store-waiting.log 2>&1      # a server store waiting for a client that never comes
    python init.py dlkill > dataloader-killed.log 2>&1  # a DataLoader worker killed by SIGKILL (as the OOM killer does)
    python init.py cuda   > no-cuda.log 2>&1            # a CUDA tensor with a CPU-only torch
    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29611 \\
        --rdzv-conf join_timeout=5 hi.py > rendezvous-timeout.log 2>&1   # one node of two started
    unshare --uts sh -c 'hostname unresolvable-node && exec torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \
        --rdzv-endpoint 192.0.2.2:29611 --rdzv-conf join_timeout=5 hi.py' > agent-hostname.log 2>&1
        # torchrun's agent cannot resolve its own host name (the endpoint is this machine's address, not loopback)
"""

import os
import signal
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

what = sys.argv[1]
if what == "client":
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=2))
if what == "server":
    dist.TCPStore("127.0.0.1", 0, world_size=2, is_master=True, timeout=timedelta(seconds=2), wait_for_workers=True)
if what == "inuse":
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    dist.TCPStore("127.0.0.1", s.getsockname()[1], is_master=True, timeout=timedelta(seconds=2))
if what == "dlkill":
    class Killed(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> int:
            os.kill(os.getpid(), signal.SIGKILL)
            return i

    for _ in torch.utils.data.DataLoader(Killed(), num_workers=1):
        pass
if what == "cuda":
    torch.zeros(1, device="cuda")
