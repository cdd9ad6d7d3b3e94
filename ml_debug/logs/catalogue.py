"""What launchers and failing programs print, and what it means: data, applied by engine.py.

- :data:`LAUNCHERS`: per launcher (or writer of one-line failures: Slurm, Python, c10d), the words that mark
  its lines, the labels it puts in front of them, and its lines that account for a failure: which rank, exit
  code, signal, or who it stopped. The pattern says *what* is on a line; its ``action`` (actions.py) says
  *what it means* for the job, or the line ``says`` the one event it means as it stands, with no code.
- :data:`FAILURE_CLASSES`: per class of failure text (an exception, an error line), its pattern, whether it
  is a cause (primary) or a peer's consequence (secondary), its kind, and the user's next step.
- :data:`STEPS`: the next step for what no class names: a crash by its signal, an exit code alone, a traceback cut
  short, a stop by the scheduler or a launcher (tests/unit/logs/test_steps.py gives each its console).

Each entry's ``needles`` are literal words every match holds one of: the prefilter (engine.py) runs a
pattern only on the lines that hold one of its needles, so most lines cost one literal scan. Every pattern
is linear in the line's length (no unbounded ``.*`` before a literal that may be absent, bounded repeats
before the needle): tests/unit/logs/test_engine.py checks both. Adding a launcher or a class: one entry
here, and a test with a real line of the real program (tests/unit/logs/test_catalogue.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ml_debug.logs.result import INFO, PRIMARY, SECONDARY, WARNING


@dataclass(frozen=True)
class Says:
    """The one event a launcher line means as it stands (read by actions.says, no action of its own):
    ``message`` and ``label`` format the match's named groups, ``match`` (what it matched) and ``line`` (the
    text after the labels); ``{name!c}`` is that text as one readable line (text.clean_message)."""

    kind: str
    cls: str
    message: str
    label: str
    who: str = "line"
    """Whose event it is: the line's writer (``line``); a node, no rank (``node``: the ``node`` group, else the
    writer's node); the node of the source's writer, no rank (``source``: a launcher's own line)."""
    strong: bool = True
    """False: evidence, never a cause by itself (a launcher stopping the other ranks)."""
    detail: tuple[str, ...] = ()
    """Groups kept in the event's detail (a group of digits as a number)."""


@dataclass(frozen=True)
class Line:
    """A launcher's line that accounts for a failure (or stops a rank), and the action that reads it."""

    action: str
    """Its name, and the reader of a match (actions.py ``ACTIONS``; actions.says for a line that ``says``)."""
    pattern: str
    needles: tuple[str, ...]
    anchored: bool = False
    """Matched at the start of the line's text (after its labels), not searched for."""
    note: str | None = None
    """What a reader must know about this line (shown with the event)."""
    who: str = "line"
    """For an ``exit``: whose exit it is besides the groups ``rank``, ``local``, ``node``: the line's writer
    (``line``), or the agent's node (``agent``: the source's node, its label's, or its srun task's)."""
    time: str = "order"
    """For an ``exit``, how its time is known: ``line`` (its stamp), ``launcher`` (when the agent saw the
    exit), ``order`` (its place in the file)."""
    weak: bool = False
    """For an ``exit``: never a cause by itself, whatever the code (ssh's exit for a node's launcher)."""
    says: Says | None = None


@dataclass(frozen=True)
class Launcher:
    """One launcher: how to know its lines, and what its failure lines say."""

    name: str
    versions: str
    marks: str = ""
    """A pattern found in its own lines or in the frames of its own tracebacks: the logs came from it."""
    mark_needles: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()
    """The labels it writes in front of a worker's lines (documentation; labels.py reads them)."""
    lines: tuple[Line, ...] = ()
    reported: bool = True
    """Named in the report's launchers when its marks are seen (False: a writer, not a launcher)."""


@dataclass(frozen=True)
class FailureClass:
    """A class of failure text: the first class whose pattern matches an exception or error line names it."""

    kind: str
    cls: str
    label: str
    """The label events of this class share; ``{what}`` is the pattern's ``what`` group."""
    pattern: str
    needles: tuple[str, ...]
    hint: str | None = None
    """The next step (verdict.next_step adds what depends on the event: its rank, its GPU)."""


# ----------------------------------------------------------------------------- launchers

RESTARTS = "torchrun restarts the workers"
INTERRUPTED = "torchrun interrupted (SIGINT)"
FINISHED = "workers finished (torchrun)"
MPIRUN_BANNER = "process failed (mpirun)"

_TORCHRUN_FAILED = Line(
    "exit",
    # every shape since torch 1.10: the logger's prefix varies ("ERROR:torch.distributed.elastic...:", glog's
    # "E0501 03:14:07.123 ... api.py:869] "), the line may be cut short after the exit code
    # (a platform's build words it "failed (exitcode: -9) for binary located at ... with local_rank: 0 (process ID: 71)")
    r"failed \(exitcode: (?P<code>-?\d+)\)(?:\s+(?:for binary located at \S{1,4096} with )?local_rank: (?P<local>\d+)"
    r"(?:\s+\((?:pid|process ID): (?P<pid>\d+)\)?)?)?",
    ("failed (exitcode:",), who="agent", time="launcher")

LAUNCHERS: tuple[Launcher, ...] = (
    Launcher(
        "deepspeed", "0.9-0.19 (deepspeed/launcher/launch.py, runner.py)",
        r"deepspeed[/.]launcher|\[launch\.py:\d+:(?:main|sigkill_handler)\]", ("deepspeed", "[launch.py:"),
        lines=(Line("exit", r"exits with return code = (?P<code>-?\d+)", ("exits with return code",),
                    who="agent", time="launcher", note="DeepSpeed's launcher prints the command line of the last rank it started, not of the one "
                         "that failed: the return code is the fact"),
               # the same line cut before its return code (a long command line, a paste): a process failed all the same
               Line("cut-exit", r"\[ERROR\] \[launch\.py:\d+:sigkill_handler\] \[", ("sigkill_handler] [",),
                    says=Says("exit", PRIMARY, "DeepSpeed's launcher reports a failed process (its line is cut before the "
                              "return code)", "process failed (DeepSpeed)", who="source", strong=False)),)),
    Launcher("accelerate", "0.20-1.15 (accelerate/commands/launch.py)", r"accelerate/commands/launch\.py|accelerate launch",
             ("accelerate",)),
    Launcher(
        "lightning", "1.x-2.6 (lightning/fabric/strategies/launchers/subprocess_script.py)",
        r"lightning/(?:pytorch|fabric)/|pytorch_lightning/|Child process with PID \d+ terminated",
        ("lightning/", "pytorch_lightning/", "Child process with PID"),
        lines=(Line("exit", r"Child process with PID (?P<pid>\d+) terminated with code (?P<code>-?\d+)",
                    ("Child process with PID",)),)),
    Launcher(
        "torchrun", "torch 1.10-2.13: torchrun, python -m torch.distributed.run and torch.distributed.launch "
        "(torch/distributed/elastic/agent/server/api.py, elastic/multiprocessing/api.py, errors/__init__.py)",
        r"torch[./]distributed[./](?:elastic|run|launch)|ChildFailedError|failed \(exitcode:",
        ("distributed/elastic", "distributed.elastic", "distributed/run", "distributed.run", "distributed/launch",
         "distributed.launch", "ChildFailedError", "failed (exitcode:"),
        prefixes=("[default0]:", "[<role>0]:", "[node12:5]:"),
        lines=(
            _TORCHRUN_FAILED,
            # its failure summary's header outside a traceback (the traceback cut off above it, or drawn in rich's box)
            Line("summary-opens", r"(?:torch\.distributed\.elastic\.multiprocessing\.errors\.)?ChildFailedError:\s*$",
                 ("ChildFailedError",), anchored=True),
            # the failure summary pasted without its traceback: an entry's "exitcode  : 1 (pid: 42)" line
            Line("summary-alone", r"\s*exitcode\s*: -?\d", ("exitcode",), anchored=True),
            Line("closing", r"Sending process (?P<pid>\d+) (?:the )?closing signal (?P<signal>SIG\w+)", ("closing signal",),
                 says=Says("launcher", INFO, "torchrun sends {signal} to pid {pid}",
                           "torchrun stops the other ranks ({signal})", who="source", strong=False,
                           detail=("pid", "signal"))),
            # --max-restarts, at LOGLEVEL=INFO (agent/server/api.py): the agent restarts its workers after a failure,
            # and later says they finished; a failure before that line was survived (verdict.restarted)
            Line("restart", r"\[(?P<role>[^\]\s]{1,100})\] Worker group (?:FAILED|UNHEALTHY)\. (?P<left>\d+)/(?P<most>\d+) "
                 r"attempts left; will restart worker group", ("attempts left",),
                 says=Says("launcher", INFO, "torchrun restarts the workers ({left} of {most} restarts left)",
                           RESTARTS, who="source", strong=False, detail=("left", "most"))),
            Line("finished", r"\] worker group successfully finished\.|Local worker group finished \(WorkerState\.SUCCEEDED\)",
                 ("successfully finished", "WorkerState.SUCCEEDED"),
                 says=Says("launcher", INFO, "torchrun's workers finished successfully", FINISHED, who="source",
                           strong=False)),
            # the agent itself stopped (api.py: "Received %s death signal, shutting down workers"): a scheduler's
            # time limit or preemption, scancel, kill; its workers' SIGTERM tracebacks follow
            Line("agent-stopped", r"Received (?P<sig>15|1|3) death signal, shutting down workers", ("death signal",),
                 says=Says("launcher", PRIMARY, "torchrun's agent received signal {sig} and stopped its workers: the job "
                           "was stopped from outside (a scheduler's time limit or preemption, scancel, kill)",
                           "stopped from outside (signal {sig})", who="source", detail=("sig",))),
            # ... by SIGINT: Ctrl-C in its terminal (or kill -INT): the user stopped the job (ending.interrupted)
            Line("agent-interrupted", r"Received 2 death signal, shutting down workers", ("death signal",),
                 says=Says("launcher", INFO, "torchrun's agent received SIGINT (Ctrl-C) and stopped its workers",
                           INTERRUPTED, who="source", strong=False)),
            # rule 6: an agent's rendezvous result says which global ranks its workers are
            # (torch 2.x prints its fields on lines of their own; a flattened paste holds them on one)
            Line("agent-ranks", r"(?:group_rank=(?P<group>\d+)[^\n]{0,400}?)?\bglobal_ranks=\[(?P<ranks>[\d, ]*)\]",
                 ("global_ranks=",)),
        )),
    # torch.multiprocessing.spawn (mp.spawn, start_processes: detectron2's and many scripts' launcher). Its traceback
    # from join() reports a process's end (blocks.py): "process 3 terminated with signal SIGSEGV", or "-- Process 2
    # terminated with the following error:" before that process's own traceback; the index is a local rank
    Launcher(
        "mp.spawn", "torch 1.x-2.13 (torch/multiprocessing/spawn.py)",
        r"torch[./]multiprocessing[./]spawn|Process(?:Raised|Exited)Exception",
        ("multiprocessing/spawn", "multiprocessing.spawn", "ProcessRaisedException", "ProcessExitedException"),
        lines=(Line("closing", r"Terminating process (?P<pid>\d+) via signal (?P<signal>SIG\w+)", ("via signal SIG",),
                    says=Says("launcher", INFO, "mp.spawn sends {signal} to pid {pid}",
                              "mp.spawn stops the other processes ({signal})", who="source", strong=False,
                              detail=("pid", "signal"))),)),
    Launcher(
        "mpirun", "Open MPI 4 (mpirun) and 5 (prterun)", r"mpirun|prterun|Primary job\s+terminated|Process name: \[",
        ("mpirun", "prterun", "Primary job", "Process name: ["), prefixes=("[1,3]<stderr>:",),
        lines=(
            # its banner before it names the process (orte/tools/orterun/help-orterun.txt): alone (a paste cut short)
            # a process failed all the same
            Line("cut-exit", r"Primary job\s+terminated normally, but (?P<n>\d+) process(?:es)? returned", ("Primary job",),
                 says=Says("launcher", PRIMARY, "mpirun reports {n} process(es) returned a non-zero exit code (which one: "
                           "not in these lines)", MPIRUN_BANNER, who="source", strong=False)),
            # "The first process to do so was: Process name: [[24168,1],2]  Exit code: 1": the rank is lines above
            Line("mpirun-exit", r"\s*Exit code:\s+(?P<code>-?\d+)", ("Exit code:",), anchored=True),
            # a redacted pid or node ("PID xxxxxx on node xxxxxxxx", as users post it) still names the rank
            Line("exit", r"process rank (?P<rank>\d+) with PID (?:(?P<pid>\d+)|\S+) on node (?P<node>\S+) exited on "
                 r"signal (?P<sig>\d+)", ("exited on signal",)),
            # its signal handler in the crashing process (opal/util/stacktrace.c: "[%s:%05d] Signal: %s (%d)")
            Line("exit", r"\[(?P<node>[\w.\-]{1,100}):(?P<pid>\d+)\] Signal: [\w ]{1,40} \((?P<sig>\d+)\)",
                 ("] Signal: ",)),
        )),
    Launcher(
        "pdsh", "pdsh 2.x (and DeepSpeed's multi-node runner through it)", r"pdsh@", ("pdsh@",), prefixes=("node12: ",),
        lines=(Line("exit", r"pdsh@\S+: (?P<node>[\w.\-]+): (?P<what>.{1,200}?) exited with exit code (?P<code>\d+)",
                    ("pdsh@",), weak=True),)),
    Launcher(
        "srun", "Slurm 20-24 (srun, slurmstepd)", r"srun: |slurmstepd", ("srun: ", "slurmstepd"), prefixes=("3: ",),
        lines=(
            Line("srun-task", r"srun: error: (?P<node>\S+): tasks? (?P<tasks>\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*): "
                 r"(?P<what>.+)", ("srun: error:",)),
            # slurmstepd could not start the task's program (src/slurmd/slurmstepd/task.c: "execve(): %s: %m")
            Line("srun-no-program", r"(?:slurmstepd-(?P<node>[\w.\-]{1,100}): error: )?execve\(\): (?P<what>\S{1,400}): "
                 r"No such file or directory", ("execve(): ",),
                 says=Says("exception", PRIMARY, "Slurm could not start {what}: no such file (not installed on the "
                           "node, or not on its PATH)", "program not found", who="node")),
            Line("srun-node-fail", r"srun: error: Node failure on (?P<node>\S+)", ("Node failure",),
                 says=Says("slurm", PRIMARY, "Slurm: node failure on {node}", "node failure", who="node")),
            Line("slurm-cancel", r"\*\*\* (?P<what>JOB|STEP) (?P<id>\S+) ON (?P<node>\S+) CANCELLED AT (?P<at>\S+)"
                 r"(?: DUE TO (?P<why>[A-Z ]{1,40}?))?(?: \*\*\*)?$", ("CANCELLED AT",)),
            # slurmstepd's count of the step's OOM kills names no task: srun's "task 5: Out Of Memory" after it
            # says whose (weak: the first failure only when no line says whose)
            Line("oom-kill", r"Detected (?P<n>\d+) oom[-_]kill event", ("oom-kill", "oom_kill"),
                 says=Says("oom", PRIMARY, "out of host memory: {n} process(es) killed by the cgroup OOM killer",
                           "out of host memory", who="node", strong=False)),
        )),
    # the controller of PyTorchJobs (pkg/controller.v1/common/pod.go: "Pod: %s.%s exited with code %v"): the pod is
    # the node
    Launcher("training-operator", "Kubeflow training-operator 1.x (its controller's log)", r"PyTorchJob|Pod: \S+ exited",
             ("PyTorchJob", "Pod: "), lines=(
                 Line("exit", r"Pod: [\w\-]{1,100}\.(?P<node>[\w.\-]{1,253}) exited with code (?P<code>-?\d+)",
                      ("exited with code",)),)),
    # rule 6: the console of one pod (kubectl logs POD > POD.log): the pod's name says which node it is
    # (sources.py reads "<job>-master-0", "<job>-worker-3" off the file's name); its lines carry no label
    Launcher("kubectl", "kubectl logs of Kubeflow PyTorchJob / JobSet pods", reported=False,
             prefixes=("[pod/job-worker-0/pytorch] ",), lines=(
        # kubectl get pods (NAME READY STATUS RESTARTS AGE): a pod whose container keeps failing, or was killed
        Line("pod-status", r"^(?P<node>[a-z0-9][\w.\-]{0,252})\s+\d+/\d+\s+(?P<what>(?:Init:)?(?:CrashLoopBackOff|Error|"
             r"OOMKilled))\s+\d+", ("CrashLoopBackOff", "OOMKilled", " Error "), anchored=True,
             says=Says("exit", PRIMARY, "{what} (kubectl get pods)", "pod {what}", who="node",
                       strong=False)),)),
    # Ray Train and TorchX prefix each worker's lines; Ray's is on every line of its console, so it is a label
    # (labels.py: the ip is the node) marked by events.Collector.sample, not a needle (every line would pass)
    Launcher("ray", "Ray Train 2.x (python/ray/_private/log_monitor.py's prefix)",
             prefixes=("(RayTrainWorker pid=123, ip=10.0.0.1) ",), lines=(
                 # src/ray/raylet/node_manager.cc: a worker process that died under a task (killed, crashed)
                 Line("ray-worker-died", r"(?:Worker IP address: (?P<node>[\w.:\-]{1,100}) [^\n]{0,100}?)?Worker PID: "
                      r"(?P<pid>\d+) Worker exit type: SYSTEM_ERROR", ("Worker exit type: SYSTEM_ERROR",),
                      says=Says("signal", PRIMARY, "Ray: worker pid {pid} died by a system error (killed or crashed)",
                                "worker died (Ray)", who="node", detail=("pid",))),)),
    Launcher("torchx", "TorchX 0.5-0.7", r"torchx[./](?:schedulers|runner|specs)|^\w[\w\-]*/\d+ \[\d+\]:", ("torchx",),
             prefixes=("trainer/0 [1]:",)),
    # not launchers: the writers of other one-line failures, in the order they are tried
    # ranks that wait for others (a hang, when the job never goes on): findings, not failures, since a healthy job
    # prints them when a rank is late. Horovod's stall inspector (horovod/common/stall_inspector.cc: "One or more
    # tensors were submitted ... waiting for remainder of ranks for more than 60 seconds. ... Stalled ops: NAME
    # [ready ranks: 0, 1, 3]"); torch 1.x's store-based barrier at process group init (distributed_c10d.py, INFO)
    Launcher("horovod", "Horovod 0.16-0.28 (horovod/common/stall_inspector.cc, horovod/runner/gloo_run.py)",
             reported=False, lines=(
        Line("stall", r"waiting for remainder of ranks for more than (?P<secs>\d+) seconds(?:[^\n]{0,2000}?\[ready "
             r"ranks: (?P<ready>[\d, ]{1,100000})\])?", ("waiting for remainder of ranks",),
             says=Says("stall", WARNING, "Horovod: ranks waited over {secs} s for the others (its stall inspector)",
                       "ranks waited for others (Horovod)", detail=("ready",))),
        # 0.21+: the ranks the others wait for on lines of their own after it (actions._missing_ranks)
        Line("stall-missing", r"Missing ranks:\s*$", ("Missing ranks:",)),
        # horovodrun's gloo runner (horovod/runner/gloo_run.py: "Process {idx} exit with status code {ec}."), idx the rank
        Line("exit", r"Process (?P<rank>\d{1,7}) exit with status code (?P<code>-?\d+)\.", ("exit with status code",),
             anchored=True),
        # its exception after them ("Horovod detected that one or more processes exited with non-zero status, ... The
        # first process to do so was:", then "Process name: 1" and "Exit code: 1"), outside its traceback (blocks.py
        # reads it in one): that rank was the first to fail
        Line("first-exit", r"(?:Horovod|Gloo job) detected that one or more processes exited with non-zero status",
             ("processes exited with non-zero status",)),)),
    Launcher("torch", "torch 1.x (torch/distributed/distributed_c10d.py)", reported=False, lines=(
        Line("barrier-wait", r"Waiting in store based barrier to initialize process group for rank: (?P<rank>\d+), "
             r"key: \S{1,200} \(world_size=(?P<world>\d+), (?:worker_count|num_workers_joined)=(?P<joined>\d+)",
             ("Waiting in store based barrier",),
             says=Says("stall", WARNING, "torch: rank {rank} waits for the others to join the process group ({joined} "
                       "of {world} joined)", "ranks waited for others (process group init)",
                       detail=("joined", "world"))),)),
    Launcher("mldebug launch", "this tool", reported=False, lines=(
        # --run-timeout since 2026-11 (before: --timeout); it causes the ranks' SIGTERM tracebacks that follow
        Line("launch-timeout", r"mldebug launch: error: --(?:run-)?timeout (?P<s>\S+) s reached",
             ("mldebug launch: error: --",),
             says=Says("launcher", PRIMARY, "the job reached mldebug launch --run-timeout {s} s: the launcher "
                       "stopped every rank", "stopped at --run-timeout", who="source")),)),
    Launcher("python", "CPython 3.8-3.14", reported=False, lines=(
        Line("tool-error", r"(?:mldebug|python\d?(?:\.\d+)?): error: (?P<msg>.+)", (": error: ",)),
        # the interpreter's own errors before any code runs (no traceback follows)
        Line("python-start", r"(?:^|(?<=/))python[\d.]{0,8}: (?P<what>can't open file|No module named|"
             r"Error while finding module specification) .+",
             ("can't open file", "No module named", "Error while finding module"),
             says=Says("exception", PRIMARY, "{match!c}", "python: {what}")),
        Line("fatal", r"Fatal Python error: (?P<msg>.+)", ("Fatal Python error",),
             says=Says("signal", PRIMARY, "{match!c}", "crash ({msg!c})")),
        Line("segfault", r"Segmentation fault", ("Segmentation fault",),
             says=Says("signal", PRIMARY, "{line!c}", "crash (Segmentation fault)")),
        # a shell's report of its child's death by another signal (bash's jobs.c: a script's "train.sh: line 12: 4567
        # Bus error               python train.py", an interactive shell's "Aborted (core dumped)" on its own line)
        Line("shell-crash", r"(?::| line \d+:) +\d+ (?P<what>Bus error|Aborted|Illegal instruction|Floating point "
             r"exception)|^(?:Bus error|Aborted|Illegal instruction|Floating point exception)(?: \(core "
             r"dumped\))?$", ("Bus error", "Aborted", "Illegal instruction", "Floating point exception"),
             says=Says("signal", PRIMARY, "crashed: {line!c} (the shell's report)", "crash (the shell's report)")),
    )),
)

# c10d's watchdog lines (ProcessGroupNCCL.cpp): read before the launchers' (their rank is in the text)
# "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, ..., Timeout(ms)=1800000) ran for 1800341 milliseconds": the parentheses nest
WATCHDOG = (r"Watchdog caught collective operation timeout: \w+\((?P<work>[^\n]{0,600}?)\) ran for (?P<ms>\d+) "
            r"milliseconds")
WATCHDOG_RANK = r"\[(?:PG [^\]]{0,200}?)?Rank (\d+)\]"
LAST_WORK = r"last enqueued NCCL work: (\d+), last completed NCCL work: (-?\d+)"


# ----------------------------------------------------------------------------- failure classes

WATCHDOG_HINT = ("an NCCL collective timed out: the rank that stopped issuing it is the cause. To make it raise in "
                 "the rank that called it, rerun with TORCH_NCCL_BLOCKING_WAIT=1 (mldebug launch --cuda-sync); a "
                 "hang at the first collective across nodes: NCCL_DEBUG=INFO shows the interface each rank chose, "
                 "set NCCL_SOCKET_IFNAME to one they share")

FAILURE_CLASSES: tuple[FailureClass, ...] = (
    # a DataLoader worker killed by SIGBUS: its shared memory (/dev/shm) ran out
    FailureClass("shm", PRIMARY, "DataLoader worker killed by a bus error (shared memory)",
                 r"DataLoader worker \(pid[^)]{0,40}\) is killed by signal: Bus error|out of shared memory|"
                 r"Unexpected bus error encountered in worker",
                 ("Bus error", "out of shared memory", "Unexpected bus error"),
                 hint="a DataLoader worker died of a bus error: /dev/shm is too small for its batches. Give the "
                      "container more (docker run --shm-size=16g, or --ipc=host; Kubernetes: an emptyDir with medium: "
                      "Memory on /dev/shm), or lower num_workers"),
    # torch's shared memory for tensors passed between processes (/dev/shm): "unable to write to file </torch_...>"
    FailureClass("shm", PRIMARY, "shared memory full (/dev/shm)",
                 r"unable to (?:write to file|open shared memory object|mmap \d+ bytes from file) </torch_",
                 ("</torch_",),
                 hint="{who} could not put a tensor in shared memory: /dev/shm is full or too small (a container's "
                      "64 MB). docker run --shm-size=16g or --ipc=host (Kubernetes: an emptyDir with medium: Memory on "
                      "/dev/shm), fewer DataLoader workers, or torch.multiprocessing.set_sharing_strategy('file_system')"),
    # NCCL's shared-memory transport could not make its segment (/dev/shm too small in a container)
    FailureClass("shm", PRIMARY, "NCCL shared-memory segment failed (/dev/shm)",
                 r"(?:Error while creating|unable to allocate|failed to (?:create|open|extend)) shared memory "
                 r"(?:segment|file)|/dev/shm/nccl-\S{1,200}[^\n]{0,400}?(?:failed|[Nn]o space|[Cc]annot)",
                 ("shared memory", "/dev/shm/nccl-"),
                 hint="NCCL could not create its shared-memory segment: /dev/shm is too small (a container's default "
                      "64 MB). docker run --shm-size=1g (or --ipc=host), or NCCL_SHM_DISABLE=1 (slower)"),
    # a process that cannot start its part: no GPU to use, its rendezvous port taken, the rendezvous out of reach
    FailureClass("init", PRIMARY, "no usable GPU",
                 r"invalid device ordinal|No CUDA GPUs are available|Found no NVIDIA driver|Torch not compiled with CUDA",
                 ("invalid device ordinal", "No CUDA GPUs", "Found no NVIDIA driver", "not compiled with CUDA"),
                 hint="{who} found no GPU it could use: more ranks per node than visible GPUs (--nproc-per-node against "
                      "nvidia-smi -L and CUDA_VISIBLE_DEVICES), a device index taken from the global rank instead of "
                      "LOCAL_RANK, no driver in the container (docker run --gpus all), or a CPU-only torch build"),
    # c10d's TCPStore (torch/csrc/distributed/c10d/socket.cpp): "The server socket has failed to listen on any local
    # network address. port: 29500, ..., name: EADDRINUSE, ..." (before torch 2.2: "Address already in use")
    FailureClass("init", PRIMARY, "rendezvous port in use", r"EADDRINUSE|[Aa]ddress already in use",
                 ("EADDRINUSE", "ddress already in use"),
                 hint="{who} could not listen on the rendezvous port: another process holds it on that host (a previous "
                      "run's, or another job's). Pick another port (torchrun --master-port or --rdzv-endpoint HOST:PORT, "
                      "MASTER_PORT) or find the holder: ss -ltnp 'sport = :PORT'"),
    # "The client socket has timed out after 1800000ms while trying to connect to (10.0.0.1, 29500)." (torch 2.x: or
    # "has failed to connect to any network address of (...)")
    FailureClass("init", PRIMARY, "rendezvous out of reach", r"client socket has (?:timed out after|failed to connect to)",
                 ("client socket has",),
                 hint="{who} could not reach the rendezvous (MASTER_ADDR:MASTER_PORT, --rdzv-endpoint): is the first "
                      "node's job started and listening there, is that address one every node can reach (not "
                      "localhost), and is the port open between the nodes (a firewall)?"),
    # the Hugging Face Hub out of reach (compute nodes often have no internet): transformers/utils/hub.py's "We couldn't
    # connect to 'https://huggingface.co' to load the files, and couldn't find them in the cached files.",
    # huggingface_hub's LocalEntryNotFoundError under HF_HUB_OFFLINE=1 without the files. Before the host names' class:
    # its causes ("Temporary failure in name resolution") come with it
    FailureClass("init", PRIMARY, "model hub out of reach",
                 r"We couldn't connect to '[^'\n]{1,200}' to load|LocalEntryNotFoundError|outgoing traffic has been "
                 r"disabled", ("We couldn't connect to", "LocalEntryNotFoundError", "outgoing traffic has been disabled"),
                 hint="{who} could not download from the Hugging Face Hub (compute nodes often have no internet): "
                      "download once where it is reachable (huggingface-cli download REPO) into a cache every node "
                      "reads (HF_HOME), then run with HF_HUB_OFFLINE=1; or set HF_ENDPOINT to a mirror they reach"),
    # a host name that does not resolve (glibc's gai_strerror: EAI_NONAME "Name or service not known", EAI_AGAIN
    # "Temporary failure in name resolution"), as Python's socket.gaierror or c10d's "(gai error: -2 - ...)" say it
    FailureClass("init", PRIMARY, "host name not resolved",
                 r"Name or service not known|Temporary failure in name resolution|nodename nor servname provided|"
                 r"No address associated with hostname",
                 ("Name or service not known", "Temporary failure in name resolution", "nodename nor servname",
                  "No address associated with hostname"),
                 hint="{who} could not resolve a host name (MASTER_ADDR, --rdzv-endpoint, a pod's service name, a "
                      "download's server): getent hosts NAME on that node says whether it resolves there; in Kubernetes "
                      "the job's headless service must exist before its pods look it up"),
    # CUDA's errors that are no kernel's: the torch build, the driver and the GPU do not fit (cudaGetErrorString's
    # words: cudaErrorNoKernelImageForDevice, cudaErrorInsufficientDriver, cudaErrorCompatNotSupportedOnDevice,
    # cudaErrorDevicesUnavailable)
    FailureClass("init", PRIMARY, "CUDA setup",
                 r"no kernel image is available for execution|CUDA driver version is insufficient|forward "
                 r"compatibility was attempted on non supported HW|CUDA-capable devices? (?:is|are) busy or unavailable",
                 ("no kernel image is available", "driver version is insufficient", "forward compatibility was",
                  "busy or unavailable"),
                 hint="{who}: this torch build does not fit the node's GPU or driver: its CUDA version against the "
                      "driver's (nvidia-smi), the GPU's architecture against torch.cuda.get_arch_list() (a new GPU needs "
                      "a newer wheel), or GPUs set to exclusive mode (nvidia-smi -q | grep 'Compute Mode')"),
    FailureClass("cuda-error", PRIMARY, "CUDA error: {what}",
                 r"CUDA error: (?!out of memory)(?P<what>[^\n]+?)(?:\s*$|\nCUDA kernel)|CUDA error: (?!out of memory)"
                 r"(?P<what2>.+)", ("CUDA error",),
                 hint="{who}: CUDA reports a kernel's error asynchronously, at a later call: the kernel that failed ran "
                      "before the line in this traceback. Rerun with CUDA_LAUNCH_BLOCKING=1{dsa} (mldebug launch "
                      "--cuda-sync sets them) to raise at the failing line, or on the CPU (CUDA_VISIBLE_DEVICES=\"\") "
                      "where an out-of-range index raises at once"),
    # a CUDA kernel's own assertion, one line per failing thread, before "CUDA error: device-side assert triggered"
    # (aten/src/ATen/native/cuda/*.cu: "...cu:1141: indexSelectLargeIndex: block: [..], thread: [..] Assertion ...")
    FailureClass("cuda-error", PRIMARY, "CUDA kernel assertion failed ({what})",
                 r"\.cu:\d+: \w{1,200}: block: \[[\d,]{1,40}\], thread: \[[\d,]{1,40}\] Assertion `?(?P<what>[^`\n]{1,300}?)`? "
                 r"failed", ("] Assertion ",)),
    # the host's memory (RAM), not the GPU's: Slurm's cgroup (srun's "task 5: Out Of Memory", slurmstepd's "Detected 1
    # oom_kill event"), Ray's memory monitor (src/ray/raylet/node_manager.cc: "1 Workers (tasks / actors) killed due to
    # memory pressure (OOM)", then its ray-oom-prevention advice), torch's CPU allocator (c10/core/impl/alloc_cpu.cpp),
    # Python's MemoryError, C++'s std::bad_alloc (not torch's OutOfMemoryError: the GPU's)
    FailureClass("oom", PRIMARY, "out of host memory",
                 r"oom[-_]kill|Out Of Memory|killed due to memory pressure|ray-oom-prevention|DefaultCPUAllocator: can't "
                 r"allocate memory|\bMemoryError\b|std::bad_alloc",
                 ("oom-kill", "oom_kill", "Out Of Memory", "memory pressure", "ray-oom-prevention", "DefaultCPUAllocator",
                  "MemoryError", "std::bad_alloc"),
                 hint="{who} ran out of the host's memory (RAM, not the GPU's), and an OOM killer ended it: the "
                      "kernel's, the job's cgroup or Ray's memory monitor (on that node: dmesg -T | grep -i 'killed "
                      "process'; under Slurm: sacct -j ID -o JobID,MaxRSS,ReqMem). Fewer DataLoader workers or a smaller "
                      "prefetch_factor, a dataset not copied into every process, or more memory for the job (sbatch --mem)"),
    FailureClass("oom", PRIMARY, "out of memory",
                 r"CUDA out of memory|OutOfMemoryError|[Oo]ut of memory|OUT_OF_MEMORY",
                 ("out of memory", "OutOfMemory", "Out of memory", "OUT_OF_MEMORY"),
                 hint="{who}{gpu} ran out of memory: lower its batch or sequence length, use activation "
                      "checkpointing, or see what else holds memory on that GPU (mldebug top, nvidia-smi){others}"),
    # the CUDA driver API's errors by their CUresult names (cuda.h), as libraries that call it raise them: CuPy's
    # "CUDADriverError: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered", Numba's, JAX's; or
    # with the bare code ("[torch_memory_saver.cpp] CUresult error  result=1 ..."). After the out-of-memory class
    FailureClass("cuda-error", PRIMARY, "CUDA driver error ({what})",
                 r"\b(?P<what>CUDA_ERROR_[A-Z_]{2,60})\b|CUresult error {1,4}(?P<what2>result=\d{1,5})",
                 ("CUDA_ERROR_", "CUresult error"),
                 hint="{who}: a call to the CUDA driver failed. After a kernel's fault (ILLEGAL_ADDRESS, LAUNCH_FAILED, "
                      "ASSERT) rerun with CUDA_LAUNCH_BLOCKING=1 to raise at the failing kernel; otherwise "
                      "(INVALID_VALUE, NOT_INITIALIZED, INVALID_CONTEXT) look at the library that made the call: its "
                      "CUDA version against the driver's (nvidia-smi), or a CUDA context used in a forked process"),
    # ATen's cuDNN check (aten/src/ATen/cudnn/Exceptions.h: "cuDNN error: " and cudnnGetErrorString's name)
    FailureClass("cuda-error", PRIMARY, "cuDNN error ({what})", r"cuDNN error: (?P<what>CUDNN_STATUS_[A-Z_]{2,40})",
                 ("cuDNN error",),
                 hint="{who}: cuDNN failed. NOT_INITIALIZED and ALLOC_FAILED most often mean the GPU's memory ran out "
                      "(or a cuDNN that does not fit the driver); EXECUTION_FAILED and MAPPING_ERROR, an earlier "
                      "kernel's fault: rerun with CUDA_LAUNCH_BLOCKING=1. torch.backends.cudnn.enabled = False tells "
                      "whether cuDNN itself is at fault"),
    # torch/csrc/cuda/CUDABlas (TORCH_CUDABLAS_CHECK: "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling ...")
    FailureClass("cuda-error", PRIMARY, "cuBLAS error ({what})", r"(?P<what>CUBLAS_STATUS_[A-Z_]{2,40})",
                 ("CUBLAS_STATUS_",),
                 hint="{who}: cuBLAS failed. ALLOC_FAILED and NOT_INITIALIZED most often mean the GPU's memory ran out; "
                      "EXECUTION_FAILED, an earlier kernel's fault (an index out of range): rerun with "
                      "CUDA_LAUNCH_BLOCKING=1; INVALID_VALUE, shapes or dtypes it refuses (a dimension of 0, a batch "
                      "too large for one call)"),
    # torch/utils/data/_utils/signal_handling.py: a worker the kernel killed (SIGKILL, "Killed")
    FailureClass("oom", PRIMARY, "DataLoader worker killed (SIGKILL)",
                 r"DataLoader worker \(pid[^)]{0,40}\) is killed by signal: Killed", ("is killed by signal: Killed",),
                 hint="a DataLoader worker of {who} was killed by SIGKILL, most often by the kernel's OOM killer: the "
                      "host ran out of memory (dmesg there: 'Out of memory: Killed process'). Lower num_workers or "
                      "prefetch_factor, or what each worker holds (a dataset copied into every worker)"),
    # a DataLoader worker that died otherwise (after the classes of its bus error and its SIGKILL;
    # torch/utils/data/dataloader.py: its own error is lost to multiprocessing)
    FailureClass("exception", PRIMARY, "DataLoader worker died",
                 r"DataLoader worker \(pid(?:\(s\))? [\d, ]{1,200}\) (?:exited unexpectedly|is killed by signal: "
                 r"(?:Segmentation fault|Floating point exception|Aborted))|Unexpected (?:segmentation fault|"
                 r"floating-point exception) encountered in worker", ("DataLoader worker (pid", "encountered in worker"),
                 hint="a DataLoader worker of {who} died and its own error is lost to multiprocessing: rerun with "
                      "num_workers=0 to get it in the main process (a crash in native code: a dataset's C library, an "
                      "image or video decoder)"),
    # the numbers became NaN or Inf: autograd's anomaly mode ("Function 'SqrtBackward0' returned nan values in its 0th
    # output"), clip_grad_norm_(error_if_nonfinite=True), a job's own check ("non-finite loss", "loss is nan")
    FailureClass("exception", PRIMARY, "non-finite values (NaN/Inf)",
                 r"returned (?:nan|inf) values in its|is non-finite, so it cannot be clipped|non-finite (?:loss|grad)|"
                 r"\bloss (?:is|became|was) (?:nan|NaN|inf)\b", ("values in its", "non-finite", "loss is ",
                                                                   "loss became ", "loss was "),
                 hint="{who}'s numbers became NaN or Inf. torch.autograd.set_detect_anomaly(True) names the operation "
                      "that made them; then a lower learning rate, gradient clipping, fp16's loss scale (or bf16), or "
                      "the batch it happened on"),
    # the disk (or its quota) is full: Python's ENOSPC, torch.save's writer
    FailureClass("exception", PRIMARY, "disk full",
                 r"No space left on device|PytorchStreamWriter failed writing file",
                 ("No space left on device", "PytorchStreamWriter failed"),
                 hint="{who} could not write a file: its disk or quota is full. df -h (and the quota) of the directory it "
                      "writes to on that node: checkpoints, logs, caches in /tmp or ~/.cache"),
    # a hardware fault: the GPU's memory or the link failed, not the program (rule 5 gives it to its rank)
    FailureClass("gpu-fault", PRIMARY, "GPU hardware error ({what})",
                 r"(?P<what>uncorrectable ECC error|ECC error encountered|NVRM: Xid|Xid \(PCI:[^)]{0,40}\): \d+|"
                 r"GPU has fallen off the bus|unrecoverable error)",
                 ("ECC error", "Xid", "fallen off the bus", "unrecoverable error"),
                 hint="{who}: the GPU reported a hardware fault: drain the node, read its kernel log (dmesg: NVRM "
                      "Xid) and run `mldebug health` there before it takes another job"),
    # NCCL src/init.cc: "Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx"
    FailureClass("nccl-error", PRIMARY, "two ranks on one GPU", r"Duplicate GPU detected", ("Duplicate GPU detected",),
                 hint="two ranks use one GPU: each rank must call torch.cuda.set_device(LOCAL_RANK) (or pass "
                      "device_id) before init_process_group, with no more ranks per node than GPUs"),
    # NCCL src/transport/net_ib.cc: "NET/IB : Got completion from peer %s with status=%d opcode=%d len=%d vendor
    # err %d" (older: "with error %d, opcode ..."): an InfiniBand work request that failed (12: retries exhausted)
    FailureClass("nccl-error", PRIMARY, "InfiniBand transfer failed",
                 r"NET/IB ?: Got completion from peer [^\n]{0,400}? with (?:error|status)", ("Got completion from peer",),
                 hint="{who}: an InfiniBand transfer to the peer it names failed (status 12: retries exhausted: the link, "
                      "a port of either host, or the peer's process gone). Read both hosts' ports (ibstat, ibv_devinfo, "
                      "the switch's counters) and the peer's own log"),
    FailureClass("nccl-error", PRIMARY, "NCCL error",
                 r"unhandled (?:cuda|system) error|ncclUnhandledCudaError|ncclSystemError|Cuda failure|ncclInternalError|"
                 r"ncclInvalidUsage|ncclInvalidArgument|invalid usage|NCCL Error \d+: |invalid argument, NCCL version",
                 ("unhandled cuda error", "unhandled system error", "ncclUnhandledCudaError", "ncclSystemError",
                  "Cuda failure", "ncclInternalError", "ncclInvalid", "invalid usage", "NCCL Error ",
                  "invalid argument, NCCL"),
                 hint="{who}: an NCCL call failed (not a timeout). Rerun with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET) "
                      "to see which: 'unhandled system error' is most often the network (NCCL_SOCKET_IFNAME, "
                      "InfiniBand) or /dev/shm; 'unhandled cuda error', a CUDA failure on that GPU; 'invalid usage', "
                      "ranks that disagree (devices, the order of collectives)"),
    # the job's environment: a module one node's Python lacks (a node's venv or image differs from the others'), a
    # compiled extension built for another torch or CUDA (the dynamic loader's "undefined symbol: _ZN3c10...")
    FailureClass("exception", PRIMARY, "module not installed", r"No module named |cannot import name ",
                 ("No module named ", "cannot import name "),
                 hint="{who} could not import a module: install it in the environment the job runs with, on every node "
                      "(a node's venv or image may differ: python -c 'import NAME' there), or put its directory on "
                      "PYTHONPATH where the ranks start; 'cannot import name' is a version of the package without it"),
    FailureClass("exception", PRIMARY, "extension built for another torch", r"\.so[.\d]*: undefined symbol: ",
                 (": undefined symbol: ",),
                 hint="{who} loaded a compiled extension (flash-attn, apex, a custom op) built against another torch, "
                      "CUDA or Python than it runs with: reinstall it for this torch (its wheel for this torch and "
                      "CUDA, or pip install --no-build-isolation to build it here)"),
    # the program's own mistakes that distributed jobs make often: a tensor left on another device (ATen's "Expected
    # all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!", the meta device's "Tensor
    # on device meta is not on the expected device cpu!"); a checkpoint saved from a wrapped model
    # (torch/nn/modules/module.py load_state_dict: "Error(s) in loading state_dict for Linear:")
    FailureClass("exception", PRIMARY, "tensors on different devices",
                 r"Expected all tensors to be on the same device|is not on the expected device",
                 ("Expected all tensors to be on the same device", "is not on the expected device"),
                 hint="{who} used tensors on different devices in one operation: one made or loaded on the CPU (or on "
                      "another rank's GPU) met the model's. Move it with .to(device), device being this rank's own "
                      "(torch.device('cuda', LOCAL_RANK)); a tensor made inside forward wants device=x.device"),
    FailureClass("exception", PRIMARY, "checkpoint does not fit the model", r"Error\(s\) in loading state_dict for ",
                 ("in loading state_dict for ",),
                 hint="{who}: the checkpoint's keys or shapes do not fit the model: saved from a wrapped model (DDP's "
                      "'module.', torch.compile's '_orig_mod.', FSDP's '_fsdp_wrapped_module.') or with another "
                      "configuration. Save the unwrapped model's state_dict (model.module), or strip the prefix when "
                      "loading; strict=False only hides the difference"),
    # the program's own use of torch.distributed (torch/nn/parallel/distributed.py, c10d's collective fingerprints
    # under TORCH_DISTRIBUTED_DEBUG=DETAIL, distributed_c10d.py)
    FailureClass("exception", PRIMARY, "DDP: parameters without a gradient",
                 r"Expected to have finished reduction in the prior iteration", ("Expected to have finished reduction",),
                 hint="{who}: some of the model's parameters took no part in the loss, so DDP waited for their "
                      "gradients: pass find_unused_parameters=True to DistributedDataParallel, or make every parameter "
                      "count (TORCH_DISTRIBUTED_DEBUG=DETAIL names the ones without a gradient)"),
    FailureClass("exception", PRIMARY, "ranks ran different collectives",
                 r"Detected mismatch between collectives on ranks", ("mismatch between collectives",),
                 hint="the ranks called different collectives (or the same with other shapes) at the same point: a "
                      "branch that depends on the rank or on its data (an early exit, a skipped batch), or a collective "
                      "only some ranks reach; the message names each rank's call"),
    FailureClass("exception", PRIMARY, "no process group",
                 r"Default process group has not been initialized|environment variable (?:RANK|WORLD_SIZE|MASTER_ADDR|"
                 r"MASTER_PORT) expected, but not set",
                 ("process group has not been initialized", "expected, but not set"),
                 hint="{who} called a collective before torch.distributed.init_process_group, or ran without a "
                      "launcher that sets RANK and WORLD_SIZE (torchrun, mldebug launch)"),
    # the consequences of another rank's failure
    # a rank (or node) that never came: c10d's TCPStore server "Timed out after 901 seconds waiting for clients. 7/8
    # clients joined.", its store-based barrier, torchrun's RendezvousTimeoutError (elastic/rendezvous/api.py)
    # torchrun's agent, when it meets a rendezvous another node's agent closed (it failed with no restart left, or
    # ended): dynamic_rendezvous.py "raise RendezvousClosedError"
    FailureClass("init", SECONDARY, "rendezvous closed by another node", r"RendezvousClosedError",
                 ("RendezvousClosedError",),
                 hint="another node's torchrun agent closed the rendezvous: its workers failed with no restart left (or "
                      "it ended): that node's console says why"),
    FailureClass("init", SECONDARY, "not every rank joined",
                 r"waiting for clients\. \d+/\d+ clients joined|RendezvousTimeoutError|store based barrier on rank",
                 ("clients joined", "RendezvousTimeoutError", "store based barrier"),
                 hint="not every rank (or node) joined within the timeout: start the job on every node with the same "
                      "--nnodes and rendezvous endpoint, and check that each can reach it (MASTER_ADDR:MASTER_PORT); "
                      "the missing ones' own logs say why"),
    # (torch 2.2+ also logs "[PG 0 Rank 3] Timeout at NCCL work: 254, last enqueued NCCL work: 254, last completed NCCL
    # work: 253." after its watchdog line)
    FailureClass("watchdog", SECONDARY, "NCCL watchdog timeout",
                 r"Watchdog caught collective|Some NCCL operations have failed or timed out|detected by watchdog at work|"
                 r"Timeout at NCCL work: \d|Received a dump signal due to a collective timeout",
                 ("Watchdog caught", "Some NCCL operations", "detected by watchdog", "Timeout at NCCL work",
                  "Received a dump signal"),
                 hint=WATCHDOG_HINT),
    FailureClass("comm", SECONDARY, "Connection reset by peer", r"Connection reset by peer|ConnectionResetError",
                 ("Connection reset by peer", "ConnectionResetError")),
    FailureClass("comm", SECONDARY, "Connection closed by peer",
                 r"Connection closed by (?:remote )?peer|closed by remote peer", ("closed by",)),
    FailureClass("comm", SECONDARY, "Broken pipe", r"Broken pipe|BrokenPipeError", ("Broken pipe", "BrokenPipeError")),
    FailureClass("comm", SECONDARY, "gloo timeout waiting for a peer",
                 r"Timed out waiting \d+ms for (?:recv|send) operation", ("Timed out waiting",)),
    FailureClass("comm", SECONDARY, "NCCL remote error",
                 r"ncclRemoteError|remote process exited or there was a network error",
                 ("ncclRemoteError", "remote process exited")),
    FailureClass("comm", SECONDARY, "NCCL communicator aborted",
                 r"NCCL communicator was aborted|[Cc]ommunicator was aborted", ("ommunicator was aborted",)),
    FailureClass("comm", SECONDARY, "a peer did not reach the barrier", r"failed to pass monitoredBarrier",
                 ("monitoredBarrier",)),
    # gloo (ProcessGroupGloo.cpp, tcp/pair.cc): "Gloo connectFullMesh failed with [.../pair.cc:152] timed out connecting:
    # SO_ERROR: Connection refused, remote=[10.0.0.2]:31337": at init, a rank could not reach a peer's own address
    FailureClass("init", SECONDARY, "gloo could not connect to a peer", r"connectFullMesh failed|timed out connecting: SO_ERROR|failed to connect, willRetry=",
                 ("connectFullMesh failed", "timed out connecting", "willRetry="),
                 hint="a rank could not connect to a peer's gloo address while its process group started: the peer ended "
                      "first (its own log says why; the ranks of a restarted attempt may still find the last attempt's "
                      "address), or the address the peer published is not one this node reaches: set GLOO_SOCKET_IFNAME "
                      "to the interface the nodes reach each other by"),
    FailureClass("comm", SECONDARY, "store lost its server",
                 r"recvValue failed|Failed to recv, got 0 bytes|DistStoreError|Socket Timeout|Connection refused|"
                 r"DistNetworkError",
                 ("recvValue failed", "Failed to recv", "DistStoreError", "Socket Timeout", "Connection refused",
                  "DistNetworkError")),
    FailureClass("watchdog", SECONDARY, "watchdog stopped the process",
                 r"watchdog thread terminated with exception|Heartbeat monitor timed out|"
                 r"taking the entire process down|watchdog got stuck for \d+ seconds|Terminating the process after "
                 r"attempting to dump debug info|Exception raised from ncclCommWatchdog",
                 ("watchdog thread terminated", "Heartbeat monitor", "entire process down", "watchdog got stuck",
                  "Terminating the process after", "from ncclCommWatchdog"), hint=WATCHDOG_HINT),
    # horovod/common/operations.cc (SHUT_DOWN_ERROR): every rank's op fails after one rank raised (or finished early)
    FailureClass("comm", SECONDARY, "Horovod shut down after a rank failed", r"Horovod has been shut down",
                 ("Horovod has been shut down",)),
    FailureClass("comm", SECONDARY, "stopped by a signal", r"SignalException|KeyboardInterrupt",
                 ("SignalException", "KeyboardInterrupt")),
    # (a crash's next step is its signal's: STEPS)
    FailureClass("signal", PRIMARY, "crash (signal)",
                 r"Segmentation fault|SIGSEGV|SIGBUS|SIGABRT|SIGFPE|SIGILL|Fatal Python error|core dumped",
                 ("Segmentation fault", "SIG", "Fatal Python error", "core dumped")),
    # a process killed by SIGKILL (an exit code -9, accelerate's "died with <Signals.SIGKILL: 9>", a shell's "Killed"):
    # its cause is not in its own lines. Also the class of such exits' events (text.signal_event_text's label)
    FailureClass("signal", PRIMARY, "killed (SIGKILL)", r"\bSIGKILL\b", ("SIGKILL",)),
)


# ----------------------------------------------------------------------------- next steps of what no class names


@dataclass(frozen=True)
class Step:
    """The next step for a failure no failure class gives one: a crash (by its signal's name), an exit code alone, a
    traceback cut short, a stop by the scheduler or a launcher. The first entry whose ``kinds`` hold the event's kind
    and whose ``pattern`` is found in its label or message gives it."""

    kinds: tuple[str, ...]
    pattern: str
    hint: str


_OWN_OUTPUT = ("the whole console, not a paste of its end; or its own file: torchrun --log-dir DIR --redirects 3 --tee 3 "
               "and srun --output=job-%j-%t.out keep one per rank, and mldebug launch does by default")

STEPS: tuple[Step, ...] = (
    # src/ray/raylet/node_manager.cc writes why it killed a worker (its memory monitor: a host OOM) in its own log
    Step(("signal", "traceback", "exception", "error-line"), r"worker died \(Ray\)|ActorDiedError|actor died unexpectedly",
         "{who}: a Ray worker process died under its task (killed or crashed): the raylet's log on that node says why "
         "(/tmp/ray/session_latest/logs/raylet.out; 'killed due to memory pressure' is its memory monitor: the host ran "
         "out of memory), and the worker's own log beside it (python-core-worker-*.log) holds its last words"),
    Step(("signal",), r"SIGSEGV|Segmentation fault",
         "{who} crashed in native code (SIGSEGV): its core file (mldebug core-bt) or a run with python -X faulthandler "
         "says where"),
    Step(("signal",), r"\bSIGKILL\b|\bKilled\b",
         "{who} was killed by SIGKILL, and its own lines cannot say by whom: most often the kernel's OOM killer (on that "
         "node: dmesg -T | grep -i 'killed process'; mldebug logs --slurm-job reads it), else the job's memory or time "
         "limit (sacct -j ID -o State,MaxRSS,ReqMem) or a kill -9"),
    Step(("signal",), r"SIGABRT|\bAbort",
         "{who} aborted (SIGABRT): native code gave up: a C++ exception nobody caught ('terminate called after throwing "
         "an instance of ...'), a failed check or assert, or c10d aborting its communicators after an error. The reason "
         "is in the lines just before the abort in its own output; its core file (mldebug core-bt) says where"),
    Step(("signal",), r"SIGBUS|Bus error",
         "{who} crashed with a bus error (SIGBUS): most often shared memory (/dev/shm) ran out under it (docker run "
         "--shm-size=16g or --ipc=host), else a file it had memory-mapped (a dataset, a checkpoint) was cut short or "
         "rewritten on disk"),
    Step(("signal",), r"SIGILL|Illegal instruction",
         "{who} ran an instruction its processor does not have (SIGILL): a binary or wheel built for a newer CPU than "
         "this node's (AVX-512, AVX2: compare lscpu's flags there with what the build assumes)"),
    Step(("signal",), r"SIGFPE|Floating point exception",
         "{who} crashed with SIGFPE: an integer division by zero in native code, most often a size or count of zero "
         "reaching a kernel or a library; its core file (mldebug core-bt) says where"),
    Step(("signal",), r"Fatal Python error",
         "{who}: the interpreter itself failed (Fatal Python error): the lines after it hold each thread's stack "
         "(faulthandler); most often a C extension's crash, or a thread touching Python at exit"),
    # an exit code, and no error of the process's own in these lines
    Step(("exit",), r"^pod ",
         "{who}: the pod's container failed: kubectl logs POD --previous shows the output of its last run, and kubectl "
         "describe pod POD its Last State (the reason and exit code; OOMKilled: the container's memory limit)"),
    Step(("exit",), r"\bexit code 137\b",
         "{who} exited with code 137, which is 128+9: it was killed by SIGKILL, most often by an OOM killer (the "
         "kernel's: dmesg -T on that node; a container's memory limit: OOMKilled), else a kill -9"),
    Step(("exit",), r"",
         "{who} exited with an error, and these lines hold none of its own: look for it in that process's own output "
         f"({_OWN_OUTPUT}), then run mldebug logs over all of it"),
    Step(("traceback", "exception"), r"traceback \(cut short\)",
         "{who}'s traceback is cut before its exception, so what failed is not in these lines: it is in that process's "
         f"own output ({_OWN_OUTPUT})"),
    # python/ray/exceptions.py: RayTaskError's text is the worker's traceback, its exception last
    Step(("traceback", "exception"), r"RayTaskError\(\w+\): ray::",
         "{who}: Ray re-raised a worker's exception, and these lines end before the worker's own, which says what "
         "failed: it follows the frames after the last RayTaskError line of the driver's output, and is in that "
         "worker's log on its node (/tmp/ray/session_latest/logs/worker-*.err)"),
    Step(("launcher",), r"worker failed \(torchrun\)",
         "torchrun's failure summary is cut short before it names the failure: the failed rank's own error is in its "
         f"own output ({_OWN_OUTPUT})"),
    # the scheduler or a signal from outside stopped the job: its accounting says why
    Step(("slurm",), r"time limit",
         "the job ran out of its time limit: sacct -j ID -o JobID,Elapsed,Timelimit,State shows it. Ask for more "
         "(sbatch --time), or save checkpoints often enough to resume (sbatch --signal=USR1@120 warns the job 2 "
         "minutes before the end)"),
    Step(("slurm",), r"task failure",
         "one of the step's tasks failed, and Slurm stopped the others (srun --kill-on-bad-exit): the failed task is "
         "the one srun does not report stopped ('Terminated', 'Killed'). Its own output says why (srun "
         "--output=job-%j-%t.out keeps one file per task)"),
    Step(("slurm",), r"preempt",
         "a job of higher priority preempted it (sacct -j ID -o JobID,State: PREEMPTED): resume from its last "
         "checkpoint, and let Slurm requeue it (sbatch --requeue)"),
    Step(("slurm",), r"node fail",
         "Slurm lost the node ({who}): sinfo -R gives the reason it is down, and its kernel log (dmesg, journalctl -k) "
         "what happened there; resume from the last checkpoint on other nodes (sbatch --exclude=NODE)"),
    Step(("slurm", "launcher"), r"cancelled|stopped from outside",
         "the job was stopped from outside: sacct -j ID -o JobID,State,Reason,Elapsed,Timelimit says by what (TIMEOUT: "
         "its time limit; PREEMPTED; CANCELLED by: a user's or an admin's scancel); mldebug logs --slurm-job ID reads "
         "it with the logs"),
    Step(("launcher",), r"run-timeout",
         "the job ran past mldebug launch --run-timeout: a rank that hung (mldebug dump-stacks, or mldebug watch while "
         "it runs, says where each rank waits) or a limit too short for the job"),
    Step(("exception",), r"^program not found\b",
         "{who}: install the program on every node, or give srun the PATH it is on: activate the job's environment in "
         "the batch script before srun, or name the program by its full path"),
    # a consequence alone (a peer's failure seen from this side): the peer's own output names the cause
    Step(("comm",), r"",
         "{who} only saw a peer fail: the cause is in the output of the rank that failed first (its own file, or the "
         "whole console): read every rank's logs together with mldebug logs DIR (or --slurm-job ID)"),
)

SCAN_WORDS: tuple[str, ...] = ("Traceback", "NCCL", "Killed", "rror")
"""Words the scanner looks for beside the needles above: tracebacks, NCCL's lines (its tallies), a kill, an
exception. (The words of lines that only look like a failure are engine.WEAK_WORDS.)"""

NCCL_LINES_PER_SOURCE = 512
"""NCCL lines of one source read in full; after them, only NCCL's findings (below). A process's first
communicators say its rings, trees and transports; later ones (a communicator per step, one line per call
with NCCL_DEBUG_SUBSYS=COLL) add nothing the report shows, and would cost a Python call per line."""
NCCL_FINDING_WORDS: tuple[str, ...] = ("NCCL WARN", "NCCL version", "Bootstrap", "NET/IB :", "NET/IB:", "NET/Socket :",
                                       "NET/Socket:", "Using network", "set by environment", "libibverbs")
