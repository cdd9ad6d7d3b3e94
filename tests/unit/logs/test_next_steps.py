"""Failure classes and the next step each needs: processes that could not start their part, programs that misuse
torch.distributed, NCCL's and CUDA's errors. Real consoles made on this machine (tests/data/logs/catalogue/init.py
and program.py say how), and the lines of NCCL, CUDA and torch that cannot be made here, as their source writes
them."""

from __future__ import annotations

from pathlib import Path

import pytest

from ml_debug.logs.text import peer
from ml_debug.logs.triage import triage
from tests.conftest import REPO

CATALOGUE = REPO / "tests" / "data" / "logs" / "catalogue"

# console: (status, the first line's start, a piece of the next step)
REAL = {
    "port-in-use.log": ("failure", "first failure: unknown rank: DistNetworkError: The server socket has failed to "
                        "listen", "another process holds it on that host"),
    "store-unreachable.log": ("failure", "first failure: unknown rank at ", "could not reach the rendezvous"),
    "no-cuda.log": ("failure", "first failure: unknown rank: AssertionError: Torch not compiled with CUDA enabled",
                    "found no GPU it could use"),
    "dataloader-killed.log": ("failure", "first failure: unknown rank: RuntimeError: DataLoader worker (pid(s) ",
                              "the kernel's OOM killer"),
    "ddp-unused.log": ("failure", "tie: ranks 0-1 failed in the same second", "find_unused_parameters=True"),
    "mismatch.log": ("failure", "tie: rank 0, rank 1 failed in the same second", "the ranks called different "
                     "collectives"),
    "no-group.log": ("failure", "first failure: unknown rank: ValueError: Default process group has not been "
                     "initialized", "before torch.distributed.init_process_group"),
    # the other side of a rendezvous that never completed: the cause is elsewhere (a node or rank that never came)
    "store-waiting.log": ("secondary-only", "no primary failure found: unknown rank failed only as a consequence of a "
                          "peer (1 x \"not every rank joined\")", "start the job on every node"),
    "no-launcher.log": ("failure", "first failure: unknown rank: ValueError: Error initializing torch.distributed using "
                        "env:// rendezvous: environment variable RANK expected", "without a launcher"),
    # mistakes.py: a module one rank's Python lacks, a tensor on another device, a checkpoint of the wrapped model
    "import-missing.log": ("failure", "first failure: rank 1, reported at ", "on every node"),
    "device-mismatch.log": ("failure", "first failure: rank 1, reported at ", "this rank's own"),
    "checkpoint-keys.log": ("failure", "first failure: rank 0, reported at ", "'module.'"),
    # torchrun's own traceback, ending in the agent's own exception, in lower case (socket.gaierror): its failure
    "agent-hostname.log": ("failure", "first failure: unknown rank: gaierror: [Errno -2] Name or service not known",
                           "getent hosts NAME"),
    "rendezvous-timeout.log": ("secondary-only", "no primary failure found: unknown rank failed only as a consequence "
                               "of a peer (1 x \"not every rank joined\")", "start the job on every node"),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_a_process_that_could_not_start_its_part_gets_its_next_step(name: str) -> None:
    status, summary, hint = REAL[name]
    v = triage([str(CATALOGUE / name)]).verdict
    assert (v.status, v.summary[:len(summary)]) == (status, summary), v.summary
    assert v.hint is not None and hint in v.hint, v.hint


def test_torchruns_rendezvous_timeout_is_its_agents_failure_not_its_report() -> None:
    """The agent's own traceback ends in an exception without a message (``RendezvousTimeoutError``): not a cut
    traceback that reports a worker's failure, and not 'no failure found'."""
    r = triage([str(CATALOGUE / "rendezvous-timeout.log")])
    assert [(e.kind, e.message) for e in r.events] == [("traceback", "RendezvousTimeoutError")], r.events


def _console(tmp_path: Path, exception: str) -> str:
    path = tmp_path / "console.log"
    path.write_text(f'Traceback (most recent call last):\n  File "/job/train.py", line 12, in <module>\n    main()\n'
                    f"{exception}\n")
    return str(path)


# torch's c10d ProcessGroupNCCL / NCCLUtils messages: "NCCL error in: FILE:LINE, " + ncclGetErrorWithVersion +
# "\n" + the error's detail ("ncclInvalidUsage: ...", "Last error:", NCCL's last WARN)
@pytest.mark.parametrize(("exception", "summary", "hint"), [
    ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, invalid "
     "usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.20.5\nncclInvalidUsage: This usually reflects "
     "invalid usage of NCCL library.\nLast error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000",
     "first failure: unknown rank: DistBackendError: NCCL error in:", "torch.cuda.set_device(LOCAL_RANK)"),
    ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
     "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3",
     "first failure: unknown rank: DistBackendError: NCCL error in:", "'unhandled system error' is most often the "
     "network"),
    # torch 1.x NCCLUtils.hpp (C10D_NCCL_CHECK): ncclGetErrorString's "invalid argument" and the version after it
    ("RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/../c10d/NCCLUtils.hpp:82, invalid argument, NCCL version "
     "2.4.8", "first failure: unknown rank: RuntimeError: NCCL error in:", "an NCCL call failed"),
    ("RuntimeError: CUDA error: out of memory", "first failure: unknown rank: RuntimeError: CUDA error: out of memory",
     "ran out of memory"),
    # Python's own, and C++'s through a binding (torch's elastic error file keeps its message)
    ("MemoryError: std::bad_alloc", "first failure: unknown rank: MemoryError: std::bad_alloc", "the host's memory"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "first failure: unknown rank: "
     "OutOfMemoryError: CUDA out of memory", "ran out of memory: lower its batch"),
    ("RuntimeError: CUDA error: invalid device ordinal", "first failure: unknown rank: RuntimeError: CUDA error: "
     "invalid device ordinal", "more ranks per node than visible GPUs"),
    # CUDA's cudaErrorNoKernelImageForDevice, as c10's CUDA check raises it: a wheel without this GPU's architecture
    ("RuntimeError: CUDA error: no kernel image is available for execution on the device\nCUDA kernel errors might be "
     "asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
     "first failure: unknown rank: RuntimeError: CUDA error: no kernel image", "torch.cuda.get_arch_list()"),
])
def test_an_nccl_or_cuda_error_gets_the_next_step_of_its_own_kind(tmp_path: Path, exception: str, summary: str,
                                                                   hint: str) -> None:
    v = triage([_console(tmp_path, exception)]).verdict
    assert v.summary.startswith(summary), v.summary
    assert v.hint is not None and hint in v.hint, v.hint


def test_a_rank_waiting_for_another_ranks_nccl_id_names_it(tmp_path: Path) -> None:
    """c10d's ``[1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] ... Socket Timeout``: rank 0
    never reached the collective; the waiting rank's error is a consequence that names it."""
    v = triage([_console(tmp_path, "torch.distributed.DistBackendError: [1] is setting up NCCL communicator and "
                         "retrieving ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got "
                         "error: Socket Timeout")]).verdict
    assert v.status == "secondary-only" and v.blamed_ranks == "0", v.summary
    assert v.summary.endswith("peers name rank(s) 0"), v.summary


@pytest.mark.parametrize("line", [
    # torch 2.x c10d while the first node is not listening yet: it retries, and the job goes on
    "[W1128 10:00:00.123456789 socket.cpp:755] [c10d] The client socket has failed to connect to [node1]:29500 (errno: "
    "111 - Connection refused).",
    # a program's logger reporting a retry
    "2026-11-28 10:00:01,000 [WARNING] data: Connection reset by peer while fetching shard 3, retrying",
])
def test_a_peers_consequence_said_by_a_warning_is_no_failure(tmp_path: Path, line: str) -> None:
    path = tmp_path / "console.log"
    path.write_text(f"{line}\nstep 1 loss 2.3\nstep 2 loss 2.1\ntraining done\n")
    v = triage([str(path)]).verdict
    assert v.status == "none" and v.summary == "no failure found", v.summary


@pytest.mark.parametrize("path", ["logs_corpus/accelerate-killed.log", "logs/catalogue/dataloader-killed.log"])
def test_a_process_killed_by_sigkill_gets_where_to_look_for_who_killed_it(path: str) -> None:
    """SIGKILL leaves nothing in the process's own lines: the next step says where the killer is told (the node's
    kernel log for the OOM killer, the job's limits). A DataLoader worker's SIGKILL keeps its own class's step."""
    v = triage([str(REPO / "tests" / "data" / path)]).verdict
    assert v.hint is not None and "OOM killer" in v.hint and "dmesg" in v.hint, v.hint


def test_the_hub_out_of_reach_is_said_over_the_name_lookup_that_caused_it(tmp_path: Path) -> None:
    """transformers raises its own OSError from the connection's failure (a node without internet): the chain holds
    glibc's "Temporary failure in name resolution" too, and the Hub's class, earlier in the catalogue, names it."""
    path = tmp_path / "console.log"
    path.write_text('Traceback (most recent call last):\n  File "/venv/urllib3/connection.py", line 198, in _new_conn\n'
                    "socket.gaierror: [Errno -3] Temporary failure in name resolution\n\n"
                    "The above exception was the direct cause of the following exception:\n\n"
                    'Traceback (most recent call last):\n  File "/job/train.py", line 12, in <module>\n'
                    "OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them "
                    "in the cached files.\n")
    v = triage([str(path)]).verdict
    assert v.summary.startswith("first failure: unknown rank: OSError: We couldn't connect to"), v.summary
    assert v.hint is not None and "HF_HUB_OFFLINE=1" in v.hint, v.hint


# c10/cuda/CUDACachingAllocator.cpp's out-of-memory message lists the processes NVML sees on the GPU
_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB "
        "of which 1.06 GiB is free. {procs}Of the allocated memory 37.90 GiB is allocated by PyTorch, and 1.11 GiB is "
        "reserved by PyTorch but unallocated.")


@pytest.mark.parametrize(("procs", "others"), [
    # another process beside this one: most often another rank on the same GPU (no set_device)
    ("Process 4242 has 38.50 GiB memory in use. Including non-PyTorch memory, this process has 39.52 GiB memory in use. ",
     True),
    # one process and no "this process": the failing one itself, seen from a container's other pid namespace
    ("Process 387746 has 78.89 GiB memory in use. ", False),
    ("Including non-PyTorch memory, this process has 78.52 GiB memory in use. ", False),
])
def test_an_out_of_memory_says_when_other_processes_held_its_gpu(tmp_path: Path, procs: str, others: bool) -> None:
    v = triage([_console(tmp_path, _OOM.format(procs=procs))]).verdict
    assert v.hint is not None and v.hint.startswith("the failing process (GPU 0) ran out of memory"), v.hint
    assert ("another rank on the same GPU" in v.hint) == others, v.hint
    assert ("pid 4242: 38.50 GiB" in v.hint) == others, v.hint


def test_ranks_that_lost_a_node_name_its_address_and_their_step_is_said_once() -> None:
    """A node lost at once (nodes.py): the other node's ranks each lose their connection to its address, and that
    node's console just stops. The address is the lead; the ranks' own step, the same for both, is said once."""
    r = triage([str(CATALOGUE / "node-lost-node1.log"), str(CATALOGUE / "node-lost-node2.log")])
    v = r.verdict
    assert v.status == "secondary-only" and v.peers_lost == "10.213.7.12", v.summary
    assert v.summary.endswith("; they lost their connection to 10.213.7.12"), v.summary
    assert v.hint is not None and v.hint.startswith("the process at 10.213.7.12 failed or its node went down first")
    assert v.hint.count("only saw a peer fail") == 1 and "ranks 0-1 only saw a peer fail" in v.hint, v.hint
    assert v.findings == [f"{CATALOGUE / 'node-lost-node2.log'} holds no failure: its writers stopped without a word "
                          "while the others failed (a node lost, a kill -9, a hang); last line: rank 3: step 2010"]


@pytest.mark.parametrize("message", [
    # NCCL misc/socket.cc (2.19+) and its older wording, as c10d raises them in a DistBackendError's "Last error:"
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there "
    "was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a network error or a "
    "remote process exiting prematurely.\nLast error:\nsocketProgress: Connection closed by remote peer gpu-node-4<38524>",
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error, NCCL version "
    "2.18.1\nncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.\n"
    "Last error:\nsocketProgressOpt: Call to recv from gpu-node-4<48722> failed : Connection reset by peer",
])
def test_nccls_words_for_a_lost_peer_name_it(message: str) -> None:
    assert peer(message) == "gpu-node-4"


def test_the_head_nodes_console_alone_points_at_the_node_that_failed() -> None:
    """Rank 3 on node2 raises (node_raise.py): node1's console alone holds only its ranks' lost connections, whose
    address is node2's; with node2's console, rank 3's exception is the first failure."""
    v = triage([str(CATALOGUE / "node-raise-node1.log")]).verdict
    assert v.status == "secondary-only" and v.peers_lost == "10.213.7.12", v.summary
    v = triage([str(CATALOGUE / f"node-raise-node{n}.log") for n in (1, 2)]).verdict
    assert v.primary is not None and v.summary.startswith("first failure: rank 3 (node2) at "), v.summary
    assert v.peers_lost is None and "loss spiked at step 40" in v.summary
