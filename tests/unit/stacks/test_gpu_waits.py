"""A rank that waits on the GPU is said to (pure): the CUDA calls of the catalogue in stacks/gpu_waits.py,
in py-spy's mixed Python+native stacks and in gdb's native ones. The real path, a rank blocked in
torch.cuda.synchronize behind a long kernel: tests/gpu/test_stuck_on_gpu.py."""

from __future__ import annotations

import pytest

from ml_debug.stacks import gpu_waits
from ml_debug.stacks.merge import Member, analyse
from ml_debug.stacks.result import Frame, ProcessDump, ThreadDump

TORCH_CUDA = "/venv/lib/python3.12/site-packages/torch/cuda/__init__.py"
TRAIN = "/home/me/run/train.py"


def native(name: str, lib: str = "libtorch_cuda.so") -> Frame:
    return Frame(name=name, kind="native", library=f"/venv/lib/python3.12/site-packages/torch/lib/{lib}")


def py(name: str, filename: str, line: int) -> Frame:
    return Frame(name=name, filename=filename, line=line)


# innermost first, as `py-spy dump --native` prints a rank in loss.item() behind a long kernel
ITEM_NATIVE = [native("0x7f3a1c2b4e10", "libcuda.so.1"), native("cuStreamSynchronize", "libcuda.so.1"),
               native("cudaStreamSynchronize", "libcudart.so.12"),
               native("c10::cuda::memcpy_and_sync(void*, void*, long, cudaMemcpyKind, CUstream_st*)"),
               native("at::native::_local_scalar_dense_cuda(at::Tensor const&)"),
               py("train_step", TRAIN, 88), py("main", TRAIN, 120), py("<module>", TRAIN, 130)]
SYNC_PYTHON_ONLY = [py("synchronize", TORCH_CUDA, 1083), py("train_step", TRAIN, 90), py("main", TRAIN, 120),
                    py("<module>", TRAIN, 130)]
LOOPING = [py("load_batch", TRAIN, 40), py("main", TRAIN, 118), py("<module>", TRAIN, 130)]


def member(rank: int, frames: list[Frame], native_frames: list[Frame] | None = None) -> Member:
    pid = 1000 + rank
    thread = ThreadDump(thread_id="1", os_thread_id=pid, name="MainThread", is_main=True, frames=frames,
                        native_frames=native_frames or [])
    return Member(host="gpu1", pid=pid, rank=rank, samples=[ProcessDump(pid=pid, ok=True, dumper="py-spy",
                                                                      threads=[thread])])


@pytest.mark.parametrize(("name", "waits"), [
    ("cudaStreamSynchronize", True), ("cudaDeviceSynchronize", True), ("cuCtxSynchronize", True),
    ("cudaEventSynchronize", True), ("cudaMemcpy", True), ("cuStreamSynchronize_ptsz", True),
    ("c10::cuda::device_synchronize()", True), ("c10::cuda::stream_synchronize(CUstream_st*)", True),
    ("cudaMemcpyAsync", False), ("cudaLaunchKernel", False), ("ncclAllReduce", False), ("memcpy", False),
])
def test_the_catalogue_names_the_calls_that_block_the_host(name: str, waits: bool) -> None:
    assert gpu_waits.is_native_sync(native(name)) is waits


def test_the_native_call_is_preferred_to_the_python_line() -> None:
    frame = gpu_waits.gpu_wait_frame(ITEM_NATIVE)
    assert frame is not None and frame.name == "cuStreamSynchronize"
    assert gpu_waits.describe(frame) == "cuStreamSynchronize"


def test_a_rank_in_item_behind_a_kernel_waits_on_the_gpu_not_in_python() -> None:
    a = analyse([member(0, ITEM_NATIVE)])
    assert a.groups[0].gpu_wait is not None
    assert a.verdict.startswith("no suspect: all 1 rank wait on the GPU in cuStreamSynchronize with the same stack")


def test_torch_cuda_synchronize_alone_is_a_gpu_wait() -> None:
    a = analyse([member(0, SYNC_PYTHON_ONLY), member(1, SYNC_PYTHON_ONLY)])
    assert a.verdict.startswith("no suspect: all 2 ranks wait on the GPU in synchronize (__init__.py:1083)")


def test_gdbs_native_frames_count_too() -> None:
    gdb = [native("cudaDeviceSynchronize", "libcudart.so.12"), native("main", "python3.12")]
    a = analyse([member(0, SYNC_PYTHON_ONLY[1:], native_frames=gdb)])
    assert a.groups[0].gpu_wait is not None and a.groups[0].gpu_wait.name == "cudaDeviceSynchronize"


def test_a_suspect_waiting_on_the_gpu_says_so_beside_where_it_is() -> None:
    others = [member(r, LOOPING) for r in range(3)]
    a = analyse([*others, member(3, ITEM_NATIVE)])
    assert a.suspects and a.suspects[0].ranks == [3]
    assert "waiting on the GPU in cuStreamSynchronize" in a.verdict


def test_a_stack_without_a_cuda_call_is_not_a_gpu_wait() -> None:
    a = analyse([member(0, LOOPING)])
    assert a.groups[0].gpu_wait is None and "GPU" not in a.verdict
