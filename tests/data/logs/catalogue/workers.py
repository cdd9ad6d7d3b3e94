"""How the consoles of a job whose DataLoader workers die, or whose disk is full, were made (torch 2.13, CPU, this
machine; the same code first ran as /tmp/lines/workers.py, the path their frames show):

    python workers.py bus   > dataloader-bus.log 2>&1     # a worker killed by SIGBUS (as a full /dev/shm does)
    python workers.py segv  > dataloader-segv.log 2>&1    # a worker that crashes in native code
    python workers.py exit  > dataloader-exit.log 2>&1    # a worker that exits (os._exit(3), as a C library may)
    python workers.py full  > disk-full.log 2>&1          # a file written to a full disk (/dev/full)
"""

import os
import signal
import sys

import torch

what = sys.argv[1]


class Dies(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        if what == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGBUS if what == "bus" else signal.SIGSEGV)
        return i


if what == "full":
    with open("/dev/full", "wb") as checkpoint:
        checkpoint.write(b"x" * 4096)
else:
    for _ in torch.utils.data.DataLoader(Dies(), num_workers=1):
        pass
