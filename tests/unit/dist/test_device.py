"""Device and backend choice: cuda+nccl with a GPU, cpu+gloo without; overrides and bad pairs."""

from __future__ import annotations

import pytest

from ml_debug.core.errors import EnvironmentProblem, UsageError
from ml_debug.dist.device import choose_device
from ml_debug.dist.world import World

W = World(rank=5, world_size=8, local_rank=5, local_world_size=8, node_rank=0, host="h",
          master_addr="127.0.0.1", master_port=29500, launcher="torchrun")


def test_auto_without_gpu_is_cpu_gloo() -> None:
    c = choose_device(W, gpu_count=0)
    assert (c.device, c.backend, c.is_cuda) == ("cpu", "gloo", False)


def test_auto_with_gpus_wraps_local_rank() -> None:
    c = choose_device(W, gpu_count=4)
    assert (c.device, c.backend, c.index) == ("cuda:1", "nccl", 1)


def test_overrides() -> None:
    assert choose_device(W, backend="gloo", gpu_count=4).device == "cpu"
    assert choose_device(W, device="cuda", backend="gloo", gpu_count=4) .backend == "gloo"
    assert choose_device(W, device="cuda:3", gpu_count=4).device == "cuda:3"
    assert choose_device(W, device="cpu", gpu_count=4).backend == "gloo"


def test_real_machine_choice() -> None:
    import torch

    c = choose_device(W)
    assert c.is_cuda == torch.cuda.is_available()


@pytest.mark.parametrize("device,backend,count,error", [
    ("cpu", "nccl", 4, UsageError), ("tpu", None, 0, UsageError), (None, "mpi", 0, UsageError),
    (None, "nccl", 0, EnvironmentProblem), ("cuda", None, 0, EnvironmentProblem),
    ("cuda:4", None, 4, EnvironmentProblem),
])
def test_impossible_combinations(device: str | None, backend: str | None, count: int, error: type) -> None:
    with pytest.raises(error) as info:
        choose_device(W, device=device, backend=backend, gpu_count=count)
    assert info.value.hint
