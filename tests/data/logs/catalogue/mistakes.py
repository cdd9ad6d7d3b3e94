"""How the consoles of a job's common mistakes were made (torch 2.13, CPU, gloo, this machine):

    torchrun --standalone --nproc-per-node 2 mistakes.py import > import-missing.log 2>&1
    torchrun --standalone --nproc-per-node 2 mistakes.py device > device-mismatch.log 2>&1
    torchrun --standalone --nproc-per-node 2 mistakes.py checkpoint > checkpoint-keys.log 2>&1

import: rank 1 imports a module its node's Python lacks (a node whose venv differs); device: rank 1 feeds the model
a tensor on another device (the meta device stands for a GPU here); checkpoint: rank 1 loads a state_dict saved from
the DDP-wrapped model into the bare one.
"""

import importlib
import sys

import torch
import torch.distributed as dist

what = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(4, 2)
print(f"rank {rank}: step 0", flush=True)
if what == "import" and rank == 1:
    importlib.import_module("flash_attn_not_here")
if what == "device" and rank == 1:
    model(torch.ones(2, 4, device="meta"))
if what == "checkpoint":
    saved = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2)).state_dict()  # on every rank: collective
    if rank == 0:
        model.load_state_dict(saved)
dist.barrier()
dist.destroy_process_group()
