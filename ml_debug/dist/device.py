"""Pick this rank's device and process-group backend: cuda+nccl when this local rank sees a GPU,
else cpu+gloo; either can be forced. Impossible pairs fail early with a hint."""

from __future__ import annotations

from dataclasses import dataclass

from ml_debug.core.errors import EnvironmentProblem, UsageError
from ml_debug.dist.world import World

BACKENDS = ("auto", "nccl", "gloo")


@dataclass(frozen=True)
class DeviceChoice:
    device: str  # "cpu" or "cuda:N"
    backend: str  # "nccl" or "gloo"

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def index(self) -> int | None:
        return int(self.device.split(":", 1)[1]) if ":" in self.device else None


def visible_gpus() -> int:
    """How many CUDA devices this process sees (respects CUDA_VISIBLE_DEVICES); 0 without CUDA."""
    import torch

    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver reads as "no GPU here", and the env report says why
        return 0


def choose_device(world: World, device: str | None = None, backend: str | None = None,
                  gpu_count: int | None = None) -> DeviceChoice:
    """cuda:{local_rank mod visible GPUs} + nccl if a GPU is visible, else cpu + gloo.

    ``--backend gloo`` alone keeps tensors on the CPU (gloo's TCP path); add ``--device cuda`` for
    gloo over CUDA tensors.

    ``device`` may be "auto", "cpu", "cuda" or "cuda:N"; ``backend`` "auto", "nccl" or "gloo".
    ``gpu_count`` is for tests; by default the visible CUDA devices are counted.
    """
    device = (device or "auto").strip().lower()
    backend = (backend or "auto").strip().lower()
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}", "use --backend nccl, gloo or auto")
    if device not in ("auto", "cpu", "cuda") and not (device.startswith("cuda:")
                                                      and device[5:].isdigit()):
        raise UsageError(f"unknown device {device!r}", "use --device auto, cpu, cuda or cuda:N")

    if device == "cpu" and backend == "nccl":
        raise UsageError("the nccl backend needs CUDA devices, and --device cpu was asked for",
                         "use --backend gloo with --device cpu, or --device cuda")
    wants_gpu = device.startswith("cuda") or backend == "nccl"
    count = None
    if device != "cpu" and not (device == "auto" and backend == "gloo"):
        count = visible_gpus() if gpu_count is None else gpu_count
    if device == "auto":
        if count and backend != "gloo":
            device = f"cuda:{world.local_rank % count}"
        elif wants_gpu:
            raise EnvironmentProblem("the nccl backend was asked for but this rank sees no CUDA device",
                                     "run `mldebug env` to see GPUs and CUDA_VISIBLE_DEVICES, "
                                     "or use --backend gloo")
        else:
            device = "cpu"
    elif device == "cuda":
        if not count:
            raise EnvironmentProblem("--device cuda but this rank sees no CUDA device",
                                     "run `mldebug env`; check CUDA_VISIBLE_DEVICES and the driver")
        device = f"cuda:{world.local_rank % count}"
    elif device.startswith("cuda:"):
        index = int(device[5:])
        if not count or index >= count:
            raise EnvironmentProblem(f"--device {device} but this rank sees {count or 0} CUDA device(s)",
                                     "pick an index below the visible count, or check CUDA_VISIBLE_DEVICES")
    if backend == "auto":
        backend = "nccl" if device.startswith("cuda") else "gloo"
    return DeviceChoice(device, backend)
