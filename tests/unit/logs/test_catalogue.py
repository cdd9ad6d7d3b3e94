"""Every entry of the catalogue (ml_debug/logs/catalogue.py) has a line of the real program that it reads: the
line passes the prefilter, holds one of the entry's needles, and its pattern (and no earlier class) reads it.

Lines come from the real consoles in tests/data (file, and a substring that picks the line). Where the program
cannot run here (Slurm's controller, a GPU, NCCL, Ray, TorchX), the line is written as the program's source
writes it, and the comment names the source file.
"""

from __future__ import annotations

import re
import string
from pathlib import Path

import pytest

from ml_debug.logs import engine
from ml_debug.logs.catalogue import FAILURE_CLASSES, LAUNCHERS
from ml_debug.logs.labels import split_label
from ml_debug.logs.text import classify
from ml_debug.logs.triage import triage
from tests.conftest import REPO

DATA = REPO / "tests" / "data"

# (file under tests/data, a substring of the line) or the line itself
Sample = tuple[str, str] | str

# (launcher, action): a line
LINES: dict[tuple[str, str], Sample] = {
    ("torchrun", "exit"): ("logs/accounting/torchrun2.log", "failed (exitcode: 1) local_rank: 1"),
    ("torchrun", "summary-alone"): ("logs/accounting/torchrun2.log", "  exitcode  : 1 (pid:"),
    ("torchrun", "summary-opens"): ("logs/catalogue/restart-failed.log", "errors.ChildFailedError:"),
    ("torchrun", "closing"): ("logs/accounting/torchrun2.log", "closing signal SIGTERM"),
    ("torchrun", "agent-ranks"): ("logs/accounting/agent1.log", "global_ranks=[2, 3]"),
    ("torchrun", "agent-stopped"): ("logs_corpus/torchrun-stopped.log", "death signal"),
    ("torchrun", "agent-interrupted"): ("logs/catalogue/torchrun-ctrl-c.log", "death signal"),
    ("torchrun", "restart"): ("logs/catalogue/restart-recovered.log", "attempts left; will restart"),
    ("torchrun", "finished"): ("logs/catalogue/restart-recovered.log", "worker group successfully finished"),
    ("mp.spawn", "closing"): ("logs_corpus/spawn-segv.log", "via signal SIGTERM"),
    ("deepspeed", "exit"): ("logs_corpus/deepspeed.log", "exits with return code"),
    # deepspeed.log's own line, cut before its return code (as a long command line gets cut in posted consoles)
    ("deepspeed", "cut-exit"): "[2026-11-27 04:22:32,383] [ERROR] [launch.py:259:sigkill_handler] ['/work/wt/logs/.venv/bin/"
                               "python', '-u', '/work/wt/logs/tests/data/logs_corpus/worker.py'",
    ("mpirun", "mpirun-exit"): ("logs_corpus/mpirun.log", "Exit code:"),
    ("mpirun", "cut-exit"): ("logs_corpus/mpirun.log", "Primary job"),
    # Open MPI 4 orte/tools/orterun/help-orterun.txt ("mpirun noticed that process rank %d with PID %d on node %s
    # exited on signal %d (%s).")
    ("mpirun", "exit"): "mpirun noticed that process rank 5 with PID 777 on node gpu03 exited on signal 11 (Segmentation "
                     "fault).",
    ("pdsh", "exit"): ("logs_corpus/pdsh.log", "exited with exit code"),
    # Lightning 2.x lightning/fabric/strategies/launchers/subprocess_script.py (_ChildProcessObserver)
    ("lightning", "exit"): "Child process with PID 4242 terminated with code 1. Forcefully terminating all other processes "
                       "to avoid zombies 🧟",
    ("srun", "srun-task"): ("logs_corpus/srun-nolabel.log", "srun: error:"),
    # Slurm src/srun/srun_job.c / step_launch.c: "Node failure on %s"
    ("srun", "srun-no-program"): ("logs/catalogue/execve.txt", "execve(): "),
    ("srun", "srun-node-fail"): "srun: error: Node failure on node17",
    ("srun", "slurm-cancel"): "slurmstepd: error: *** JOB 8 ON node1 CANCELLED AT 2025-03-02T03:14:09 DUE TO TIME LIMIT ***",
    # Slurm src/plugins/task/cgroup (task_cgroup_memory.c): "Detected %"PRIu64" oom_kill event%s in %ps."
    ("srun", "oom-kill"): "slurmstepd: error: Detected 1 oom_kill event in StepId=1234.0. Some of the step tasks have been OOM "
                "Killed.",
    # kubectl get pods' table (NAME READY STATUS RESTARTS AGE)
    ("kubectl", "pod-status"): "pytorchjob-example-82cjcqdz-master-0         0/2     CrashLoopBackOff   8          2m32s",
    # Kubeflow training-operator pkg/controller.v1/common/pod.go: logger.Infof("Pod: %v.%v exited with code %v", ...)
    ("training-operator", "exit"): "1.7085078566441019e+09\tDEBUG\tevents\tPod: kubeflow.pytorch-simple-worker-0 exited "
                                   "with code 1",
    # Ray 2.x src/ray/raylet/node_manager.cc ("... Worker IP address: " ... " Worker PID: " ... " Worker exit type: ")
    ("ray", "ray-worker-died"): "(raylet) A worker died or was killed while executing a task by an unexpected system "
    "error. To troubleshoot the problem, check the logs for the dead worker. RayTask ID: ffffffffffffffff7ab5e339a44fee5d"
    " Worker ID: 88aeec634aec99cb478d00f526 Node ID: dae8173a69c4863c3a71 Worker IP address: 10.0.10.143 Worker port: "
    "10002 Worker PID: 2147 Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a "
    "connection error code 2. End of file.",
    # Horovod 0.16-0.19 horovod/common/stall_inspector.cc (the message, then "Stalled ops: NAME [ready ranks: ...]")
    ("horovod", "stall"): "WARNING: One or more tensors were submitted to be reduced, gathered or broadcasted by subset "
    "of ranks and are waiting for remainder of ranks for more than 60 seconds. This may indicate that different ranks are "
    "trying to submit different tensors or that only subset of ranks is submitting tensors, which will cause deadlock. "
    "Stalled ops: allreduce.conv1.grad [ready ranks: 0, 1, 3]",
    # Horovod 0.21+ horovod/common/stall_inspector.cc: the message (LOG(WARNING), glog-like prefix), "Missing ranks:",
    # then one line per rank: "3: [tensor, ...]" ("3!: [...]" past the shutdown time)
    ("horovod", "stall-missing"): "Missing ranks:",
    # horovodrun's gloo runner, horovod/runner/gloo_run.py ("Process {idx} exit with status code {ec}.")
    ("horovod", "exit"): "Process 3 exit with status code 1.",
    # its RuntimeError after them (gloo_run.py: "Horovod detected that one or more processes exited with non-zero "
    # "status, thus causing the job to be terminated. The first process to do so was:\nProcess name: {name}\n...")
    ("horovod", "first-exit"): "RuntimeError: Horovod detected that one or more processes exited with non-zero status, "
                               "thus causing the job to be terminated. The first process to do so was:",
    # torch 1.x torch/distributed/distributed_c10d.py (_store_based_barrier's INFO line)
    ("torch", "barrier-wait"): "I0510 07:28:04.417845 139863945226048 distributed_c10d.py:337] Waiting in store based "
    "barrier to initialize process group for rank: 2, key: store_based_barrier_key:2 (world_size=8, worker_count=7, "
    "timeout=0:30:00)",
    ("mldebug launch", "launch-timeout"): ("logs/launch_timeout/vm/console.log", "--timeout 5 s reached"),
    ("python", "tool-error"): ("logs/launch_nan_rank1_stopped_first/vm/console.log", ": error: "),
    ("python", "python-start"): ("logs/catalogue/start.txt", "can't open file"),
    ("python", "fatal"): ("logs/catalogue/fatal.txt", "Fatal Python error"),
    ("python", "segfault"): ("logs/catalogue/segv.txt", "Segmentation fault"),
    ("python", "shell-crash"): ("logs/catalogue/shell-bus-error.log", "Bus error"),
}

# more lines of an entry already above: each line of the catalogue reads one of its samples
MORE: list[tuple[tuple[str, str], Sample]] = [
    # Open MPI's signal handler in the crashing process, opal/util/stacktrace.c ("[%s:%05d] Signal: %s (%d)")
    (("mpirun", "exit"), "[c4140-02:236649] Signal: Segmentation fault (11)"),
    # torchrun's agent as a platform's build words it (a user's console from Alibaba PAI-DLC)
    (("torchrun", "exit"), "[dlc1mtq58q0821ib-master-0] [2026-03-30 19:24:42,731] torch.distributed.elastic."
     "multiprocessing.api: [ERROR] failed (exitcode: -9) for binary located at /opt/conda/bin/python3.10 with "
     "local_rank: 0 (process ID: 71)"),
    (("torchrun", "closing"), "[dlc1mtq58q0821ib-master-0] [2026-03-30 19:24:35,966] torch.distributed.elastic."
     "multiprocessing.api: [WARNING] Sending process 73 the closing signal SIGTERM"),
    # an interactive bash's report of its foreground job (jobs.c: the signal's name, " (core dumped)", own line)
    (("python", "shell-crash"), "Aborted (core dumped)"),
    (("python", "shell-crash"), ("logs/catalogue/shell-fpe.log", "Floating point exception")),
    # the orterun line with its pid and node redacted, as users post it
    (("mpirun", "exit"), "mpirun noticed that process rank 1 with PID xxxxxx on node xxxxxxxx exited on signal 9 (Killed)."),
]

CLASSES: dict[str, Sample] = {
    "DataLoader worker killed by a bus error (shared memory)": ("logs_corpus/torchrun-bus.log", "Bus error"),
    # NCCL 2.12-2.21 src/misc/shmutils.cc
    "NCCL shared-memory segment failed (/dev/shm)": "3d3e22c3066f:168:168 [0] misc/shmutils.cc:113 NCCL WARN Error while "
    "creating shared memory segment /dev/shm/nccl-UbzKZ9 (size 9637888)",
    # c10d ProcessGroupNCCL.cpp's watchdog, torch 2.4-2.13 (C10_CUDA_CHECK's message)
    "CUDA error: {what}": "[E1128 03:14:07.123456 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank 3] "
    "Process group watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered",
    # ATen's CUDA kernels (aten/src/ATen/native/cuda/Indexing.cu's CUDA_KERNEL_ASSERT), one line per failing thread
    "CUDA kernel assertion failed ({what})": "../aten/src/ATen/native/cuda/Indexing.cu:1141: indexSelectLargeIndex: "
    "block: [615,0,0], thread: [121,0,0] Assertion `srcIndex < srcSelectDimSize` failed.",
    # CuPy's cupy_backends/cuda/api/driver.pyx (check_status: CUDADriverError(f"{name}: {message}"), cuGetErrorName's
    # and cuGetErrorString's words)
    "CUDA driver error ({what})": "cupy_backends.cuda.api.driver.CUDADriverError: CUDA_ERROR_ILLEGAL_ADDRESS: an "
    "illegal memory access was encountered",
    # ATen's aten/src/ATen/cudnn/Exceptions.h (AT_ERROR("cuDNN error: ", cudnnGetErrorString(status)))
    "cuDNN error ({what})": "RuntimeError: cuDNN error: CUDNN_STATUS_NOT_INITIALIZED",
    # torch's aten/src/ATen/cuda/CUDABlas.cpp (TORCH_CUDABLAS_CHECK: "CUDA error: ", the status's name, " when calling ")
    "cuBLAS error ({what})": "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, "
                             "opa, opb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc)`",
    "module not installed": ("logs/catalogue/import-missing.log", "ModuleNotFoundError"),
    # CPython's dlopen error (Python/dynload_shlib.c: the loader's dlerror()) for an extension built for another torch
    "extension built for another torch": "ImportError: /opt/venv/lib/python3.11/site-packages/flash_attn_2_cuda.cpython-311-"
                                         "x86_64-linux-gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEi",
    "tensors on different devices": ("logs/catalogue/device-mismatch.log", "is not on the expected device"),
    "checkpoint does not fit the model": ("logs/catalogue/checkpoint-keys.log", "in loading state_dict for"),
    # torch/distributed/elastic/rendezvous/dynamic_rendezvous.py ("raise RendezvousClosedError"), its traceback's end
    "rendezvous closed by another node": "torch.distributed.elastic.rendezvous.api.RendezvousClosedError",
    # torch's shared-memory allocator (aten/src/ATen/MapAllocator.cpp: "unable to write to file <%s>: %s (%d)")
    "shared memory full (/dev/shm)": "RuntimeError: unable to write to file </torch_4012_1841309476_0>: No space left on "
                                     "device (28)",
    "DataLoader worker died": ("logs/catalogue/dataloader-exit.log", "exited unexpectedly with exit code 3"),
    "disk full": ("logs/catalogue/disk-full.log", "No space left on device"),
    "non-finite values (NaN/Inf)": ("logs/catalogue/nan-anomaly.log", "returned nan values"),
    "killed (SIGKILL)": ("logs_corpus/accelerate-killed.log", "died with <Signals.SIGKILL: 9>"),
    "no usable GPU": ("logs/catalogue/no-cuda.log", "AssertionError: Torch not compiled"),
    # CUDA's cudaErrorNoKernelImageForDevice as c10's CUDA check raises it (a wheel without this GPU's architecture)
    "CUDA setup": "RuntimeError: CUDA error: no kernel image is available for execution on the device",
    "DDP: parameters without a gradient": ("logs/catalogue/ddp-unused.log", "[rank1]: RuntimeError: Expected"),
    "ranks ran different collectives": ("logs/catalogue/mismatch.log", "[rank0]: RuntimeError: Detected mismatch"),
    "no process group": ("logs/catalogue/no-group.log", "ValueError: Default process group"),
    "rendezvous port in use": ("logs/catalogue/port-in-use.log", "DistNetworkError"),
    "rendezvous out of reach": ("logs/catalogue/store-unreachable.log", "torch.distributed.DistNetworkError: The client"),
    # Ray 2.x src/ray/raylet/node_manager.cc (its memory monitor's report, after the raylet's glog-like prefix)
    "out of host memory": "(raylet) [2025-04-02 15:02:00,117 E 135782 135782] (raylet) node_manager.cc:3069: 1 Workers "
                          "(tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at "
                          "node (ID: 351e406b, IP: 10.95.143.76) over the last time period.",
    "out of memory": ("logs_corpus/torchrun-oom.log", "OutOfMemoryError"),
    # transformers/utils/hub.py (cached_files): the Hub out of reach and the files not in the cache
    "model hub out of reach": "OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't "
                              "find them in the cached files.",
    # CPython's socket.gaierror, with glibc's gai_strerror(EAI_NONAME)
    "host name not resolved": "socket.gaierror: [Errno -2] Name or service not known",
    "DataLoader worker killed (SIGKILL)": ("logs/catalogue/dataloader-killed.log", "is killed by signal: Killed"),
    # the NVIDIA driver's kernel log (dmesg): "NVRM: Xid (PCI:%04x:%02x:%02x): %d, ..."
    "GPU hardware error ({what})": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
    # NCCL 2.19+ src/transport/net_ib.cc ("NET/IB : Got completion from peer %s with status=%d opcode=%d len=%d vendor
    # err %d (%s)%s%s%s%s")
    "InfiniBand transfer failed": "node1:1234:1300 [0] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from "
    "peer 10.0.0.2<57306> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.1 remoteGids::ffff:"
    "10.0.0.2",
    # NCCL src/include/checks.h (CUDACHECK): "Cuda failure '%s'"; the error names ncclUnhandledCudaError
    "NCCL error": "node1:1234:1234 [0] enqueue.cc:1234 NCCL WARN Cuda failure 'an illegal memory access was "
                  "encountered'",
    # NCCL src/init.cc ("Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx"), after torch's
    # "Last error:" in its DistBackendError's message
    "two ranks on one GPU": "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000",
    "not every rank joined": ("logs/catalogue/store-waiting.log", "clients joined"),
    "NCCL watchdog timeout": ("logs/watchdog_one_rank_silent.log", "Watchdog caught"),
    "Connection reset by peer": ("logs/raise_then_sigabrt_at_exit/console.log", "Connection reset by peer"),
    "Connection closed by peer": ("logs/raise_then_sigabrt_at_exit/console.log", "closed by"),
    "Broken pipe": ("logs/accounting/agent0.log", "Broken pipe"),
    "gloo timeout waiting for a peer": ("logs/catalogue/gloo_recv.log", "RuntimeError: [/"),
    # NCCL 2.12+ src/include/nccl.h's ncclRemoteError, as torch's ProcessGroupNCCL raises it
    "NCCL remote error": "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process "
                        "exited or there was a network error, NCCL version 2.21.5",
    # torch c10d ProcessGroupNCCL.cpp (abort): "NCCL communicator was aborted on rank %d."
    "NCCL communicator aborted": "RuntimeError: NCCL communicator was aborted on rank 1.",
    "a peer did not reach the barrier": ("logs/catalogue/gloo_barrier.log", "RuntimeError: [Rank 0]"),
    "gloo could not connect to a peer": ("logs/catalogue/restart-failed.log", "RuntimeError: Gloo connectFullMesh failed"),
    "store lost its server": ("logs/accounting/agent0.log", "DistNetworkError: Failed to recv"),
    # c10d ProcessGroupNCCL.cpp (heartbeat monitor, torch 2.3+)
    "watchdog stopped the process": "[E1128 03:14:07.123456 ProcessGroupNCCL.cpp:1404] [PG ID 0 PG GUID 0(default_pg) "
    "Rank 2] Heartbeat monitor timed out! Process will be terminated after dumping debug info.",
    # Horovod horovod/common/operations.cc's SHUT_DOWN_ERROR, as TensorFlow's op kernel logs it
    "Horovod shut down after a rank failed": "2018-07-30 06:41:52.525932: W tensorflow/core/framework/op_kernel.cc:1318] "
    "OP_REQUIRES failed at mpi_ops.cc:422 : Aborted: Horovod has been shut down. This was caused by an exception on one "
    "of the ranks or an attempt to allreduce, allgather or broadcast a tensor after one of the ranks finished execution.",
    "stopped by a signal": ("logs/launch_timeout/vm/console.log", "SignalException: Process"),
    "crash (signal)": ("logs_corpus/torchrun-segv.log", "(SIGSEGV)"),
}

# launcher marks: the launcher, and a line of its own
MARKS: dict[str, Sample] = {
    "deepspeed": ("logs_corpus/deepspeed.log", "[launch.py:"),
    "accelerate": ("logs_corpus/accelerate.log", "accelerate/commands/launch.py"),
    "lightning": ("logs_corpus/lightning.log", "lightning/"),
    "torchrun": ("logs/accounting/torchrun2.log", "torch/distributed/elastic/multiprocessing/api.py"),
    "mpirun": ("logs_corpus/mpirun.log", "Process name: ["),
    "mp.spawn": ("logs_corpus/spawn-segv.log", "ProcessExitedException"),
    "pdsh": ("logs_corpus/pdsh.log", "pdsh@"),
    "srun": ("logs_corpus/srun-nolabel.log", "srun: error:"),
    # TorchX 0.7 torchx/schedulers/local_scheduler.py's traceback frames
    # its own log (pkg/controller.v1/common/pod.go)
    "training-operator": "Pod: kubeflow.pytorch-simple-worker-0 exited with code 1",
    "torchx": '  File "/opt/venv/lib/python3.11/site-packages/torchx/schedulers/local_scheduler.py", line 1012, in wait',
}


def _line(sample: Sample) -> str:
    if isinstance(sample, str):
        return sample
    name, part = sample
    for line in (DATA / name).read_text().splitlines():
        if part in line:
            return line
    raise AssertionError(f"no line of {name} holds {part!r}")


def _passes_prefilter(line: str) -> bool:
    data = (line + "\n").encode()
    return engine.prefilter().candidates(data, len(data)) == [0]


def test_every_entry_has_a_line() -> None:
    entries = {(launcher.name, line.action) for launcher in LAUNCHERS for line in launcher.lines}
    assert entries == set(LINES), entries ^ set(LINES)
    assert {c.label for c in FAILURE_CLASSES} == set(CLASSES)
    assert {launcher.name for launcher in LAUNCHERS if launcher.marks} == set(MARKS)


def test_a_said_event_is_formatted_from_its_own_match() -> None:
    """A line that says its event (``Line.says``, no action of its own) formats its message and label from its
    pattern's groups, ``match`` and ``line`` only, and names whose event it is."""
    for launcher in LAUNCHERS:
        for line in launcher.lines:
            if line.says is None:
                continue
            fields = set(re.compile(line.pattern).groupindex) | {"match", "line"}
            for fmt in (line.says.message, line.says.label):
                used = {name for _, name, _, _ in string.Formatter().parse(fmt) if name}
                assert used <= fields, (launcher.name, line.action, used - fields)
            assert line.says.who in ("line", "node", "source"), (launcher.name, line.action)


SAMPLES = [*LINES.items(), *MORE]


@pytest.mark.parametrize(("entry", "sample"), SAMPLES, ids=[f"{'/'.join(e)}-{i}" for i, (e, _) in enumerate(SAMPLES)])
def test_a_launcher_line_is_read_by_its_entry(entry: tuple[str, str], sample: Sample) -> None:
    line = _line(sample)
    rest = split_label(line).rest
    assert _passes_prefilter(line), line
    got = [(rule.launcher.name, rule.line.action) for rule, _ in engine.launcher_lines(rest)]
    assert entry in got, (line, got)


def test_a_platforms_wording_of_torchruns_exit_names_the_local_rank_and_pid() -> None:
    rest = split_label(_line(next(sample for entry, sample in MORE if entry == ("torchrun", "exit")))).rest
    ((_, m),) = [(r, m) for r, m in engine.launcher_lines(rest) if r.line.action == "exit"]
    assert (m.group("code"), m.group("local"), m.group("pid")) == ("-9", "0", "71"), m.groupdict()


def test_every_line_of_the_catalogue_reads_one_of_its_samples() -> None:
    for rule in engine.LINE_RULES:
        mine = [split_label(_line(s)).rest for e, s in SAMPLES if e == (rule.launcher.name, rule.line.action)]
        read = rule.rx.match if rule.line.anchored else rule.rx.search
        assert any(read(text) for text in mine), (rule.launcher.name, rule.line.pattern)


@pytest.mark.parametrize("label", sorted(CLASSES))
def test_a_failure_line_is_classed_by_its_entry(label: str) -> None:
    line = _line(CLASSES[label])
    entry = next(c for c in FAILURE_CLASSES if c.label == label)
    assert _passes_prefilter(line), line
    assert any(n in line for n in entry.needles), (line, entry.needles)
    cls, got, kind = classify(split_label(line).rest)
    assert (cls, kind) == (entry.cls, entry.kind) and (got == label or "{what}" in label), (line, cls, got, kind)


@pytest.mark.parametrize("name", sorted(MARKS))
def test_a_launchers_line_marks_it(name: str) -> None:
    line = _line(MARKS[name])
    assert _passes_prefilter(line), line
    assert name in list(engine.marks(line)), line


def test_a_ray_consoles_prefix_names_the_worker_and_its_node(tmp_path: Path) -> None:
    """Ray 2.x's log monitor prefixes each worker's lines with its actor, pid and ip
    (python/ray/_private/log_monitor.py): the prefix is the writer's label, its ip the node, Ray the launcher."""
    prefix = "(RayTrainWorker pid=81234, ip=10.0.0.12) "
    lines = ["step 10 loss 2.31", "Traceback (most recent call last):", '  File "/job/train.py", line 12, in <module>',
             "    raise ValueError('bad batch')", "ValueError: bad batch"]
    path = tmp_path / "ray.log"
    path.write_text("".join(prefix + ln + "\n" for ln in lines) + "(RayTrainWorker pid=81235, ip=10.0.0.13) step 10\n")
    report = triage([str(path)])
    v = report.verdict
    assert v.primary is not None and v.primary.who.node == "10.0.0.12" and "bad batch" in v.primary.message, v.summary
    assert "ray" in report.launchers, report.launchers


def test_a_watchdog_line_cut_short_is_still_the_watchdogs() -> None:
    """A console copied from a log viewer cuts c10d's long watchdog line: what is left still names the class."""
    cls, label, kind = classify("[rank6]:[E ProcessGroupNCCL.cpp:563] [Rank 6] Watchdog caught collective")
    assert (label, kind) == ("NCCL watchdog timeout", "watchdog"), (cls, label, kind)


def test_rays_re_raised_exception_is_a_failure(tmp_path: Path) -> None:
    """Ray re-raises a worker's exception in the driver as ``RayTaskError(<its type>)`` (python/ray/exceptions.py);
    a paste of the driver's traceback's end is a failure, not 'no failure found'."""
    path = tmp_path / "driver.log"
    path.write_text("    raise value.as_instanceof_cause()\nray.exceptions.RayTaskError(DistBackendError): "
                    "ray::_RayTrainWorker__execute.get_next() (pid=192, ip=10.0.0.19, actor_id=a3e4eb7bfa5c10d4)\n")
    v = triage([str(path)]).verdict
    assert v.status == "failure" and v.primary is not None and "RayTaskError(DistBackendError)" in v.primary.message


@pytest.mark.parametrize("line", [
    # c10d ProcessGroupNCCL.cpp's heartbeat monitor (torch 2.4+): a rank hung in a collective, then killed
    "[rank6]:[E429 13:55:49.123456 ProcessGroupNCCL.cpp:1425] [PG ID 0 PG GUID 0(default_pg) Rank 6] ProcessGroupNCCL's "
    "watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives.",
    "[rank6]:[F429 14:03:49.123456 ProcessGroupNCCL.cpp:1224] [PG ID 0 PG GUID 0(default_pg) Rank 6] Terminating the "
    "process after attempting to dump debug info, due to ProcessGroupNCCL watchdog hang.",
    # c10's location of an exception the watchdog thread raised
    "Exception raised from ncclCommWatchdog at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1601 (most recent "
    "call first):",
])
def test_the_watchdogs_own_end_of_a_hung_rank_is_a_failure(tmp_path: Path, line: str) -> None:
    assert _passes_prefilter(line), line
    cls, label, kind = classify(split_label(line).rest)
    assert (label, kind) == ("watchdog stopped the process", "watchdog"), (cls, label, kind)
    path = tmp_path / "hung.log"
    path.write_text(line + "\n")
    v = triage([str(path)]).verdict
    assert v.status == "secondary-only", v.summary


def test_a_cuda_kernels_assertion_is_the_failure_and_gets_cudas_next_step(tmp_path: Path) -> None:
    """A paste that ends in the kernel's assertion lines, before "CUDA error: device-side assert triggered"."""
    path = tmp_path / "assert.log"
    path.write_text("".join(f"../aten/src/ATen/native/cuda/Indexing.cu:1141: indexSelectLargeIndex: block: [615,0,0], "
                            f"thread: [{t},0,0] Assertion `srcIndex < srcSelectDimSize` failed.\n" for t in range(3)))
    v = triage([str(path)]).verdict
    assert v.status == "failure" and v.primary is not None and v.primary.kind == "cuda-error", v.summary
    assert v.hint is not None and "CUDA_LAUNCH_BLOCKING=1" in v.hint, v.hint


def test_an_exception_the_watchdog_detected_is_its_ranks_and_keeps_its_progress(tmp_path: Path) -> None:
    """c10d (torch 2.2+): "Exception (either an error or timeout) detected by watchdog at work: N, last enqueued NCCL
    work: ..., last completed NCCL work: ...": a watchdog failure of that rank, and how far it got."""
    path = tmp_path / "console.log"
    path.write_text("[rank3]:[E321 02:07:08.465224069 ProcessGroupNCCL.cpp:1664] [PG 1 Rank 3] Exception (either an "
                    "error or timeout) detected by watchdog at work: 1580, last enqueued NCCL work: 1582, last completed "
                    "NCCL work: 1579.\n")
    report = triage([str(path)])
    assert [(e.kind, e.who.rank) for e in report.events] == [("watchdog", 3)], report.events
    assert report.progress["nccl_work"]["completed"] == {"3": 1579}, report.progress


def test_a_timeout_at_nccl_work_is_the_watchdogs_and_keeps_its_progress(tmp_path: Path) -> None:
    """c10d (torch 2.2+, ProcessGroupNCCL.cpp's watchdog): "Timeout at NCCL work: N, last enqueued NCCL work: ..., last
    completed NCCL work: ..." after its watchdog line; grepped out of a log alone, it still says the timeout."""
    path = tmp_path / "console.log"
    path.write_text("[rank3]:[E1128 10:00:00.000 ProcessGroupNCCL.cpp:1537] [PG 0 Rank 3] Timeout at NCCL work: 254, "
                    "last enqueued NCCL work: 254, last completed NCCL work: 253.\n")
    report = triage([str(path)])
    assert [(e.kind, e.label, e.who.rank) for e in report.events] == [("watchdog", "NCCL watchdog timeout", 3)]
    assert report.progress["nccl_work"]["completed"] == {"3": 253}, report.progress


def test_a_shells_report_of_a_crash_is_the_failure_and_a_cpp_terminates_what_is_read() -> None:
    """bash's "line 1: PID Bus error  COMMAND" is the crash. After libstdc++'s "terminate called after throwing ...",
    its "what():  CUDA error: ..." line names the failure (its class and next step). The terminate line itself says
    nothing more: c10d's watchdog ends a hung rank so too, a consequence (its what() says so)."""
    v = triage([str(DATA / "logs" / "catalogue" / "shell-bus-error.log")]).verdict
    assert v.summary.startswith("first failure: unknown rank: crashed: job_BUS.sh: line 1: "), v.summary
    assert v.primary is not None and v.primary.strong and v.primary.label == "crash (the shell's report)", v.primary
    v = triage([str(DATA / "logs" / "catalogue" / "cpp-terminate.log")]).verdict
    assert v.summary == "first failure: unknown rank: CUDA error: an illegal memory access was encountered", v.summary
    assert v.hint is not None and "CUDA_LAUNCH_BLOCKING=1" in v.hint, v.hint


def test_ranks_that_waited_for_others_are_a_finding_not_a_failure(tmp_path: Path) -> None:
    """A stall warning is printed by healthy jobs too (a rank late by a minute): the job is not called failed, but
    the first line says ranks waited, and the finding names the rank they waited for (the one not ready)."""
    path = tmp_path / "console.log"
    path.write_text("step 100 loss 2.1\n" + _line(LINES[("horovod", "stall")]) + "\n")
    report = triage([str(path)])
    v = report.verdict
    assert v.status == "none" and report.ok, v.summary
    assert v.summary.endswith("but ranks waited for others (below): a hang, if the job never went on"), v.summary
    assert [f for f in v.findings if "they waited for rank 2:" in f], v.findings


def test_a_failure_torchrun_restarted_the_workers_after_is_survived_once_they_finish(tmp_path: Path) -> None:
    """--max-restarts at LOGLEVEL=INFO: the agent says it restarts the workers and, later, that they finished. The
    failure before was survived: status recovered, exit 0, the failure still named. Without the agent's word that
    they finished (torchrun's default level; a console cut after the restart), or with a failure after it, the job
    failed."""
    recovered = DATA / "logs" / "catalogue" / "restart-recovered.log"
    report = triage([str(recovered)])
    v = report.verdict
    assert (v.status, report.ok) == ("recovered", True), v.summary
    assert v.summary.startswith("the job recovered: torchrun restarted the workers once and says they finished "
                                "successfully after the failure; first failure: rank 1, "), v.summary
    assert v.primary is not None and v.primary.message == "RuntimeError: flaky data shard: checksum mismatch"
    failed = triage([str(DATA / "logs" / "catalogue" / "restart-failed.log")]).verdict
    assert failed.status == "failure" and failed.summary.startswith("first failure: rank 1, "), failed.summary
    # at torchrun's default level its agent reports one failed worker per attempt: three reports, two restarts, and
    # the restarted ranks failed otherwise (they found the first attempt's gloo address)
    assert ("torchrun's agent (pid 4288) restarted its workers twice (--max-restarts) and all 3 attempts failed; the "
            "first failure named is the first attempt's; the later ones failed with: \"gloo could not connect to a "
            "peer\"") in failed.findings, failed.findings
    assert not [f for f in v.findings if "restarted its workers" in f], v.findings  # one report: no restart told
    lines = recovered.read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.log"
    cut.write_text("".join(line for line in lines if "finished" not in line))
    assert triage([str(cut)]).verdict.status == "failure"
    later = tmp_path / "later.log"
    later.write_text("".join(lines) + "[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered\n")
    assert triage([str(later)]).verdict.status == "failure"
    # another node's agent console, whose worker failed before this one's finished: that node did not recover
    other = tmp_path / "node2.log"
    first_attempt = (DATA / "logs" / "catalogue" / "restart-failed.log").read_text().splitlines(keepends=True)[:8]
    other.write_text("".join(first_attempt).replace("19:50:3", "19:50:0"))  # its worker's exit at 19:50:01
    assert "failed (exitcode: 1)" in first_attempt[-1]
    assert triage([str(recovered), str(other)]).verdict.status == "failure"


def test_a_console_torchrun_went_on_after_without_its_failure_summary_may_have_recovered(tmp_path: Path) -> None:
    """At torchrun's default level its agent reports the failed worker and says nothing of the restart, nor of the
    workers finishing: the console goes on past the failure and ends without the failure summary torchrun prints when
    the job fails. Still a failure (the job's end is not in these lines), and its first line says it may have
    recovered. A console that ends at the failure, or with torchrun's summary, says nothing of it."""
    default = DATA / "logs" / "catalogue" / "restart-recovered-default.log"
    v = triage([str(default)]).verdict
    assert v.status == "failure" and v.summary.endswith("; but torchrun went on after it (below): the job may have "
                                                        "recovered"), v.summary
    assert [f for f in v.findings if f.startswith("torchrun's agent reported local rank 1 on unknown node's failure at "
                                                  "line 8 of ") and "4 lines follow it" in f], v.findings
    failed = triage([str(DATA / "logs" / "catalogue" / "restart-failed.log")]).verdict
    assert "went on" not in failed.summary and not [f for f in failed.findings if "lines follow it" in f]
    cut = tmp_path / "cut.log"
    cut.write_text("".join(default.read_text().splitlines(keepends=True)[:9]))
    assert "went on" not in triage([str(cut)]).verdict.summary


HOROVOD_STALL = ("[2026-11-28 10:00:00.123456: W /tmp/pip-req-build/horovod/common/stall_inspector.cc:107] One or more "
                 "tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and are waiting for "
                 "remainder of ranks for more than 60 seconds. This may indicate that different ranks are trying to "
                 "submit different tensors or that only subset of ranks is submitting tensors, which will cause deadlock. ")


def test_horovods_missing_ranks_are_the_ranks_waited_for_and_a_shutdown_names_its_stalled_rank(tmp_path: Path) -> None:
    """Horovod 0.21+ lists the ranks the others waited for on lines of their own after "Missing ranks:" (unlabelled,
    "3: [...]" reads like srun --label's task 3); past HOROVOD_STALL_SHUTDOWN_TIME_SECONDS it marks them "!" and
    shuts the job down: each marked rank is a failure."""
    ranks = ["3: [DistributedAdamOptimizer_Allreduce/cond_10/HorovodAllreduce_grads_10_0, grads_11_0]",
             "5: [DistributedAdamOptimizer_Allreduce/cond_10/HorovodAllreduce_grads_10_0]"]
    path = tmp_path / "console.log"
    path.write_text("\n".join(["Epoch 1/90", HOROVOD_STALL, "Missing ranks:", *ranks, "Epoch 1/90 step 229"]) + "\n")
    v = triage([str(path)]).verdict
    assert v.status == "none", v.summary
    assert [f for f in v.findings if "they waited for ranks 3,5:" in f], v.findings
    shut = 'One or more rank (marked by "!") is stalled for longer than 120 seconds. Will shutdown.'
    path.write_text("\n".join([HOROVOD_STALL, "Missing ranks:", "3!: " + ranks[0][3:], ranks[1], shut]) + "\n")
    v = triage([str(path)]).verdict
    assert v.status == "failure" and v.primary is not None and v.primary.who.rank == 3, v.summary
    assert v.summary.startswith("first failure: rank 3: Horovod shut the job down: rank 3 stalled"), v.summary
    assert [f for f in v.findings if "they waited for ranks 3,5:" in f], v.findings


@pytest.mark.parametrize(("line", "label"), [
    # torch 1.0-1.3 torch/lib/c10d/NCCLUtils.hpp ("NCCL Error " + std::to_string(error) + ": " + ncclGetErrorString)
    ("RuntimeError: NCCL Error 2: unhandled system error", "NCCL error"),
    ("RuntimeError: NCCL Error 3: internal error", "NCCL error"),
    # torch 2.4+ ProcessGroupNCCL.cpp: a rank's watchdog after a collective timeout (its own, or a peer's)
    ("[rank0]:[E1128 10:00:00.000000 123 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 0] Received a "
     "dump signal due to a collective timeout from this local rank and we will try our best to dump the debug info. "
     "Last enqueued NCCL work: 5, last completed NCCL work: 4.", "NCCL watchdog timeout"),
    # torch's DataLoader worker signal handler (torch/csrc/DataLoader.cpp), before the main process's traceback
    (("logs/catalogue/dataloader-bus.log", "Unexpected bus error"), "DataLoader worker killed by a bus error (shared memory)"),
    (("logs/catalogue/dataloader-segv.log", "Unexpected segmentation fault"), "DataLoader worker died"),
    (("logs/catalogue/nan-clip.log", "RuntimeError: The total norm"), "non-finite values (NaN/Inf)"),
    (("logs/nan_every_rank_names_rank1.log", "non-finite loss on rank 1"), "non-finite values (NaN/Inf)"),
])
def test_more_wordings_of_a_class(line: Sample, label: str) -> None:
    line = _line(line)
    assert _passes_prefilter(line), line
    assert classify(split_label(line).rest)[1] == label, classify(split_label(line).rest)


def test_a_dataloader_workers_death_is_the_failure_with_the_step_its_signal_calls_for() -> None:
    """A worker's SIGBUS (a full /dev/shm) and SIGSEGV end in the main process's chained traceback, which torch's
    worker handler starts with a NUL byte: read all the same, with the next step for the bus error (/dev/shm) or for
    a crash whose own error is lost (num_workers=0)."""
    bus = triage([str(DATA / "logs" / "catalogue" / "dataloader-bus.log")]).verdict
    assert bus.primary is not None and bus.primary.label == "DataLoader worker killed by a bus error (shared memory)"
    assert bus.hint is not None and "--shm-size" in bus.hint, bus.hint
    segv = triage([str(DATA / "logs" / "catalogue" / "dataloader-segv.log")]).verdict
    assert segv.primary is not None and segv.primary.kind == "traceback", segv.summary
    assert segv.hint is not None and "num_workers=0" in segv.hint, segv.hint


def test_horovodruns_gloo_runner_names_the_rank_that_exited(tmp_path: Path) -> None:
    path = tmp_path / "console.log"
    path.write_text("epoch 1\nProcess 3 exit with status code 1.\nTerminating remaining workers after failure of "
                    "Process 3.\n")
    v = triage([str(path)]).verdict
    assert v.summary.startswith("first failure: rank 3: exited with code 1"), v.summary
