"""Where a stack waits on the GPU: the CUDA calls that block the host until queued GPU work ends.

A rank in ``torch.cuda.synchronize()``, ``tensor.item()``, ``.cpu()`` or ``.tolist()`` stands in the
CUDA runtime until every kernel queued before it has finished: a long kernel, a kernel that never
ends, or an NCCL collective whose peers never came (NCCL's collectives return at once; the host
blocks at the next synchronising call). Python shows only the user's line (``loss.item()``); the
native frames under it (``py-spy dump --native``, gdb's ``bt``) name the call. While it waits, the
CUDA runtime spins or yields on a CPU, so the kernel's view reads "spinning" or ``sched_yield``, or
an ``ioctl`` on ``/dev/nvidia*`` with blocking sync: the native frame is the evidence.

The catalogue is data: a new blocking call is one entry here and one case in
tests/unit/stacks/test_gpu_waits.py.
"""

from __future__ import annotations

from collections.abc import Iterable

from ml_debug.stacks.result import Frame

# Native functions (C API, runtime API, and c10's wrappers) that return only when the GPU has caught
# up. Matched on the name without its arguments, exactly or as the last `::` component.
# cudaMemcpy (not ...Async) synchronises with the default stream.
NATIVE_SYNC = frozenset({
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpy2D",
    "cuCtxSynchronize", "cuStreamSynchronize", "cuStreamSynchronize_ptsz", "cuEventSynchronize",
    "cuMemcpyDtoH", "cuMemcpyDtoH_v2", "cuMemcpy",
    "device_synchronize", "stream_synchronize", "memcpy_and_sync",  # c10::cuda::
})
# Python functions of torch's CUDA modules that block the host on the GPU (when native frames were not
# taken, these are the evidence that remains).
PY_SYNC = frozenset({"synchronize"})
PY_SYNC_FILES = ("torch/cuda/__init__.py", "torch/cuda/streams.py", "torch/cuda/")


def _bare(name: str) -> str:
    """``c10::cuda::stream_synchronize(CUstream_st*)`` -> ``stream_synchronize``."""
    return name.split("(", 1)[0].strip().rsplit("::", 1)[-1]


def is_native_sync(frame: Frame) -> bool:
    return frame.kind == "native" and _bare(frame.name) in NATIVE_SYNC


def is_python_sync(frame: Frame) -> bool:
    if frame.kind != "py" or frame.name.rsplit(".", 1)[-1] not in PY_SYNC:
        return False
    path = frame.filename.replace("\\", "/")
    return any(p in path for p in PY_SYNC_FILES)


def gpu_wait_frame(frames: Iterable[Frame]) -> Frame | None:
    """The frame that says this stack waits on the GPU (innermost first in, the native call preferred over
    the Python one), or None."""
    python: Frame | None = None
    for f in frames:
        if is_native_sync(f):
            return f
        if python is None and is_python_sync(f):
            python = f
    return python


def describe(frame: Frame) -> str:
    """``cudaStreamSynchronize`` or ``synchronize (torch/cuda/__init__.py:1083)`` for a verdict line."""
    return _bare(frame.name) if frame.kind == "native" else frame.where(brief=True)
