"""How the consoles of programs that misuse torch.distributed were made (torch 2.13, CPU, gloo, this machine):

    torchrun --standalone --nproc-per-node 2 program.py unused   > ddp-unused.log 2>&1
    TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone --nproc-per-node 2 program.py mismatch > mismatch.log 2>&1
    python program.py nogroup > no-group.log 2>&1
    python program.py nolauncher > no-launcher.log 2>&1

unused: DDP over a model with a parameter that takes no part in the loss (the second step raises); mismatch: rank 1
calls all_gather where rank 0 calls all_reduce; nogroup: a collective without init_process_group; nolauncher:
init_process_group without a launcher (no RANK).
"""

import sys

import torch
import torch.distributed as dist

what = sys.argv[1]
if what == "nogroup":
    dist.barrier()
dist.init_process_group("gloo")
rank = dist.get_rank()
if what == "unused":
    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.unused = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    model = torch.nn.parallel.DistributedDataParallel(Two())
    for _ in range(2):
        model(torch.randn(8, 4)).sum().backward()
if what == "mismatch":
    t = torch.ones(4)
    if rank == 1:
        dist.all_gather([torch.zeros(4), torch.zeros(4)], t)
    else:
        dist.all_reduce(t)
dist.destroy_process_group()
