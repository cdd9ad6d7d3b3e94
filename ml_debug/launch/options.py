"""The options of `mldebug launch` (cheap to import: no torch, no rich)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ml_debug.core.errors import UsageError
from ml_debug.core.options import argument, option
from ml_debug.dist.options import debug_no_wait_option, debug_port_option, debug_rank_option

TORCHRUN = "torchrun"
EXTRAS = "Extras"
DEVICE_COUNTS = ("gpu", "cpu", "xpu", "auto")


def _positive(word: str, flag: str, hint: str) -> int:
    try:
        n = int(word)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"{flag} {word!r} is not a positive number", hint)
    return n


def parse_nproc_per_node(word: str) -> str:
    """torchrun's --nproc-per-node: a positive number or a device kind (refused here, before torchrun would fail
    with a traceback after the log directory was made)."""
    if word in DEVICE_COUNTS:
        return word
    hint = f"a number of ranks (1 or more), or one of {', '.join(DEVICE_COUNTS)}"
    return str(_positive(word, "--nproc-per-node", hint))


def parse_nnodes(word: str) -> str:
    """torchrun's --nnodes: N, or MIN:MAX with 1 <= MIN <= MAX."""
    hint = "a number of nodes (1 or more), or MIN:MAX for an elastic job (e.g. 2:4)"
    parts = [_positive(w, "--nnodes", hint) for w in word.split(":")] if word.count(":") <= 1 else []
    if not parts or parts[0] > parts[-1]:
        raise UsageError(f"--nnodes {word!r} is not N or MIN:MAX", hint)
    return ":".join(map(str, parts))


def parse_rdzv_endpoint(word: str) -> str:
    """torchrun's --rdzv-endpoint: HOST:PORT (torchrun fails with a traceback, after the log directory was made,
    on a host it cannot resolve or a port that is no number)."""
    host, sep, port = word.strip().rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--rdzv-endpoint {word!r} is not HOST:PORT",
                         "e.g. --rdzv-endpoint $MASTER_ADDR:29500 (the host of the rendezvous and a free port)")
    return word.strip()


def parse_log_dir(word: str) -> Path:
    """--log-dir: a directory; an empty word (an unset shell variable) would put the logs in the current one."""
    if not word.strip():
        raise UsageError("--log-dir is empty", "give a directory, e.g. --log-dir logs/$SLURM_JOB_ID")
    path = Path(word)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--log-dir {word} is a file, not a directory", "give a directory (made when missing)")
    return path


@dataclass(frozen=True)
class LaunchJobOptions:
    """The options of `mldebug launch`: torchrun's own (passed on as given), where logs go, extras."""

    command: list[str] = argument(
        default_factory=list, metavar="SCRIPT [ARGS]...", empty=True,
        help="The training script and its arguments (with -m: a module; with --no-python: a program). Put -- "
             "before them.")
    nproc_per_node: str = option("1", metavar="N", panel=TORCHRUN, parse=parse_nproc_per_node,
                                 help="Ranks on this node: a number, gpu, cpu, xpu or auto (torchrun's --nproc-per-node).")
    nnodes: str = option("1", metavar="N|MIN:MAX", panel=TORCHRUN, parse=parse_nnodes,
                         help="Nodes (torchrun's --nnodes).")
    node_rank: int | None = option(None, min=0, panel=TORCHRUN,
                                   help="This node's rank with a static rendezvous (torchrun's --node-rank; default "
                                        "under srun with --nnodes > 1: this node's SLURM_NODEID).")
    master_addr: str | None = option(None, panel=TORCHRUN, help="torchrun's --master-addr (static rendezvous).")
    master_port: int | None = option(None, min=1, max=65535, panel=TORCHRUN, help="torchrun's --master-port.")
    rdzv_backend: str | None = option(None, panel=TORCHRUN, help="torchrun's --rdzv-backend (e.g. c10d).")
    rdzv_endpoint: str | None = option(None, metavar="HOST:PORT", panel=TORCHRUN, parse=parse_rdzv_endpoint,
                                       help="torchrun's --rdzv-endpoint.")
    rdzv_id: str | None = option(None, panel=TORCHRUN, help="torchrun's --rdzv-id (e.g. $SLURM_JOB_ID).")
    standalone: bool = option(False, panel=TORCHRUN,
                              help="torchrun's --standalone (one node, a free port; the default with --nnodes 1 and no "
                                   "rendezvous options).")
    max_restarts: int = option(0, min=0, panel=TORCHRUN, help="torchrun's --max-restarts.")
    module: bool = option(False, flags=("-m", "--module"), panel=TORCHRUN,
                          help="Run the command as a Python module (torchrun -m).")
    no_python: bool = option(False, panel=TORCHRUN,
                             help="Run the command as a program, not a Python script (torchrun --no-python).")
    torchrun_arg: list[str] = option(
        default_factory=list, metavar="ARG", panel=TORCHRUN,
        help="Another torchrun option, passed as one word (repeatable), e.g. --torchrun-arg=--monitor-interval=1.")
    log_dir: Path | None = option(
        None, envvar="MLDEBUG_LOG_DIR", parse=parse_log_dir,
        help="Where the logs go (default: mldebug-logs/<SLURM_JOB_ID, --rdzv-id or the start time>): "
             "LOG_DIR/<host>/console.log (every line labelled [host:LOCAL rankR]:), LOG_DIR/<host>/torchelastic/ "
             "(per-rank files and error files) and LOG_DIR/<host>/launch.json. Read them with `mldebug logs LOG_DIR`.")
    timeout: float | None = option(None, flags=("--run-timeout",), renamed_from=("--timeout",), min=1.0, metavar="S",
                                   help="Stop the job after this many seconds (torchrun gets SIGTERM and stops its "
                                        "ranks).")
    trace: bool = option(False, panel=EXTRAS,
                         help="Run every rank under `mldebug trace --ring` (its last calls, written at exit, on "
                              "SIGTERM/SIGUSR1 and after 60 s of quiet) into LOG_DIR/<host>/trace/.")
    trace_ring: int = option(10000, min=1, metavar="N", panel=EXTRAS, help="With --trace: events kept per thread.")
    flight_recorder: bool = option(
        False, panel=EXTRAS,
        help="Turn PyTorch's Flight Recorder on (TORCH_FR_BUFFER_SIZE, dumps on NCCL timeouts into "
             "LOG_DIR/<host>/fr/) and set MLDEBUG_FR_DIR, so `mldebug dump-stacks` can ask any backend's ranks "
             "for a dump (the script calls ml_debug.flight_recorder.enable()).")
    cuda_sync: bool = option(
        False, panel=EXTRAS,
        help="Make asynchronous errors point at their cause: CUDA_LAUNCH_BLOCKING=1 (a failing kernel raises at its "
             "own Python line), TORCH_USE_CUDA_DSA=1 (device-side asserts say which), TORCH_NCCL_BLOCKING_WAIT=1 (a "
             "hung collective raises in the rank that called it). Slower: for rerunning a failure, not for training.")
    debug_rank: int | None = debug_rank_option(EXTRAS)
    debug_port: int = debug_port_option(EXTRAS)
    debug_no_wait: bool = debug_no_wait_option(EXTRAS)
    verdict: bool = option(True, flags=("--verdict/--no-verdict",), panel=EXTRAS,
                           help="When the job fails, print the `mldebug logs` verdict of this node's logs.")
