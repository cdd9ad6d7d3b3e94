"""How dataloader-raise.log was made (torch 2.13, CPU, gloo, this machine; the same code first ran as /tmp/real2/dlerr.py,
the path its frames show): rank 1's DataLoader worker raises on one sample, and torch re-raises it in the rank as
"KeyError: Caught KeyError in DataLoader worker process 1." with the worker's "Original Traceback" under it:

    torchrun --nproc-per-node 2 loader_raise.py > dataloader-raise.log 2>&1
"""

import torch
import torch.distributed as dist


class Data(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        if dist_rank == 1 and i == 37:
            raise KeyError(f"sample {i}: missing field 'labels'")
        return torch.ones(4)


dist.init_process_group("gloo")
dist_rank = dist.get_rank()
loader = torch.utils.data.DataLoader(Data(), batch_size=4, num_workers=2)
for step, batch in enumerate(loader):
    t = batch.sum()
    dist.all_reduce(t)
    print(f"rank {dist_rank} step {step}", flush=True)
