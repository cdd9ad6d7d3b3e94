"""Self-launch N local ranks of an mldebug command through torch's elastic launcher API.

``mldebug gpu-test --nproc-per-node 4`` is the same as
``torchrun --nproc-per-node 4 --no-python mldebug gpu-test``, without typing torchrun; multi-node
takes ``--nnodes/--node-rank/--master-addr/--master-port`` like torchrun's static rendezvous.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ml_debug.core import lifecycle
from ml_debug.core.errors import ExitCode, PartialResult, UsageError, first_line

WORKER_MODULE = "ml_debug.cli.worker"  # each rank runs the CLI through this entry point (named, not imported)
KILLED = -15  # a rank stopped by the launcher because another one failed


@dataclass(frozen=True)
class SpawnSpec:
    """What torchrun's command line would say."""

    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_timeout_s: float = 120.0  # how long node 0 waits for the other nodes (and they for it)
    run_timeout_s: float | None = None  # stop every rank after this long, whatever they do
    linger_s: float = 30.0  # once one rank has finished, stop the others after this long
    cpu_ranks: bool = True  # set OMP_NUM_THREADS=1 unless the user set it
    wrapper: tuple[str, ...] = ()  # python's words before ``[-m] -- worker``: a rank under debugpy (debug_rank_argv)


@dataclass
class SpawnResult:
    """Exit code of every rank this node launched (global rank -> code; negative: killed by signal)."""

    exit_codes: dict[int, int] = field(default_factory=dict)
    timed_out: bool = False
    stopped: list[int] = field(default_factory=list)
    """Ranks still running ``linger_s`` after another rank finished, which the launcher stopped."""
    documents: dict[int, str] = field(default_factory=dict)
    """The JSON document each rank wrote (--json), by global rank: the launcher prints one for the run."""

    @property
    def code(self) -> int:
        """The command's exit code: global rank 0's (it prints the verdict) on node 0, else the worst."""
        if not self.exit_codes or self.timed_out:
            return ExitCode.PARTIAL
        if 0 in self.exit_codes:
            return self.exit_codes[0] if self.exit_codes[0] >= 0 else ExitCode.PARTIAL
        codes = list(self.exit_codes.values())
        return ExitCode.PARTIAL if min(codes) < 0 else max(codes)


class SpawnInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the ranks; what they had written is in ``result``."""

    def __init__(self, result: SpawnResult) -> None:
        super().__init__()
        self.result = result


WORKDIR_PREFIX = "mldebug-launch-"


LOCK_NAME = ".launcher.lock"


def _abandoned(path: str) -> bool:
    """Whether no launcher holds the folder's lock any more. The lock (flock), not the pid in the name, says
    so: a launcher in another PID namespace (a container, a Slurm or netns node sharing /tmp) has a pid this
    node's /proc does not show, and the kernel drops the lock when its holder dies, SIGKILL included."""
    import fcntl

    try:
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:  # an older mldebug's folder, or one a launcher made this instant (its lock comes next)
        try:
            return time.time() - os.lstat(path).st_mtime > 60
        except OSError:
            return False
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _workdir() -> tuple[str, int]:
    """A fresh folder for one launch (ranks' exit codes, torch's agent logs) and the fd of the lock that
    says it is in use, held until the launch ends (:func:`_abandoned`).

    A launcher stopped by SIGKILL cannot remove its folder: the next launch removes such leftovers,
    those of this user that no launcher holds (never another user's, never through a link)."""
    import fcntl

    base = tempfile.gettempdir()
    try:
        names = os.listdir(base)
    except OSError:
        names = []
    for name in names:
        if not name.startswith(WORKDIR_PREFIX):
            continue
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and _abandoned(path):
            shutil.rmtree(path, ignore_errors=True)
    path = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-")
    lock = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    return path, lock


def free_port() -> int:
    """An unused TCP port on this host (for the single-node rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _stop_stragglers(workdir: str, ranks: range, linger_s: float, result: SpawnResult,
                     done: threading.Event) -> None:
    """Once one rank has finished, give the others ``linger_s``; then stop the launch, naming them.

    Without this a rank hung outside any collective (a deadlock, a sleep) keeps the launcher waiting
    forever after its peers timed out and left.
    """
    def finished() -> list[int]:
        return [r for r in ranks if os.path.exists(os.path.join(workdir, f"rank{r}.rc"))]

    while not done.wait(0.2):
        if finished():
            break
    else:
        return
    if done.wait(linger_s):
        return
    result.stopped = [r for r in ranks if r not in finished()]
    if result.stopped:
        os.kill(os.getpid(), signal.SIGTERM)  # the agent turns this into a clean stop of every rank


_JOINED = re.compile(r"(\d+)/(\d+) clients joined")


def _missing_nodes(spec: SpawnSpec, addr: str, port: int, error: BaseException) -> PartialResult:
    """The rendezvous of a multi-node self-launch ended without every node (torch says `DistStoreError: Timed
    out after 31 seconds waiting for clients. 1/2 clients joined.`, once an internal error after twice the
    time asked for): exit 4, naming the nodes that never came."""
    where = f"{addr}:{port}"
    why = first_line(error)
    if spec.nnodes == 1:  # no other node to wait for: this node's own rendezvous store failed
        return PartialResult(f"the ranks' rendezvous at {where} failed: {why}: no rank started",
                             "run again; if it repeats, give --master-port a free port")
    if spec.node_rank == 0:
        others = list(range(1, spec.nnodes))
        joined = _JOINED.search(why)
        came = f" ({int(joined.group(1)) - 1} of {spec.nnodes - 1} did)" if joined and spec.nnodes > 2 else ""
        names = ", ".join(map(str, others))
        message = (f"node rank{'s' if len(others) > 1 else ''} {names} never joined the rendezvous at {where} within "
                   f"{spec.rdzv_timeout_s:g} s{came}: no rank started")
    else:
        message = (f"node rank 0 (the master, {where}) never answered within {spec.rdzv_timeout_s:g} s: no rank "
                   f"started ({why})")
    return PartialResult(message, f"start the same command on every node, --node-rank 0 .. {spec.nnodes - 1}, within "
                                  "--init-timeout of each other, with the same --master-addr and --master-port, and "
                                  "check that node 0's port can be reached")


def validate(spec: SpawnSpec) -> SpawnSpec:
    if spec.nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node {spec.nproc_per_node} must be at least 1", "use 1 or more")
    if spec.nnodes < 1 or not 0 <= spec.node_rank < spec.nnodes:
        raise UsageError(f"--node-rank {spec.node_rank} is outside --nnodes {spec.nnodes}",
                         "node ranks are 0 .. nnodes-1, one per node")
    if spec.nnodes > 1 and not spec.master_addr:
        raise UsageError("--nnodes > 1 needs --master-addr (the host of node rank 0)",
                         "e.g. --master-addr $(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)")
    if spec.master_port is not None and not 0 < spec.master_port < 65536:
        raise UsageError(f"--master-port {spec.master_port} is not a valid port", "use 1024-65535")
    return spec


def spawn(argv: Sequence[str], spec: SpawnSpec, env: Mapping[str, str] | None = None) -> SpawnResult:
    """Run ``python -m ml_debug <argv>`` as ``spec.nproc_per_node`` ranks of a (multi-node) world.

    Returns each rank's exit code. Workers inherit stdout/stderr; rank 0 prints the verdict.
    """
    spec = validate(spec)
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # torch's agent logs every start, stop and failed rank; the command reports those itself. Its
    # modules set their own loggers' levels, so each one is quieted, not just the parent.
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.distributed.launcher")):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    addr = spec.master_addr or "127.0.0.1"
    port = spec.master_port or (free_port() if spec.nnodes == 1 else 29500)
    workdir, workdir_lock = _workdir()
    saved = dict(os.environ)
    handlers = lifecycle.handlers()  # torch's agent installs its own for the launch
    timer: threading.Timer | None = None
    result = SpawnResult()
    try:
        os.environ["MLDEBUG_LAUNCH_DIR"] = workdir
        if spec.cpu_ranks:
            os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.update(env or {})
        # a rank dies with this process, even when it is SIGKILLed (on a GPU node a rank left running holds
        # its GPU); SIGKILL, because a rank may be stuck where no SIGTERM handler runs
        os.environ.update(lifecycle.child_env(signal.SIGKILL))
        config = LaunchConfig(
            min_nodes=spec.nnodes, max_nodes=spec.nnodes, nproc_per_node=spec.nproc_per_node,
            run_id=f"mldebug-{port}" if spec.nnodes > 1 else f"mldebug-{uuid.uuid4().hex[:12]}",
            role="mldebug", rdzv_endpoint=f"{addr}:{port}", rdzv_backend="static",
            rdzv_configs={"rank": spec.node_rank, "timeout": max(1, int(spec.rdzv_timeout_s))},
            max_restarts=0, monitor_interval=0.2,
            logs_specs=DefaultLogsSpecs(log_dir=os.path.join(workdir, "logs")),
        )
        if spec.run_timeout_s:
            def _expire() -> None:
                result.timed_out = True
                os.kill(os.getpid(), signal.SIGTERM)  # the agent turns this into a clean stop

            timer = threading.Timer(spec.run_timeout_s, _expire)
            timer.daemon = True
            timer.start()
        first = spec.node_rank * spec.nproc_per_node
        ranks = range(first, first + spec.nproc_per_node)
        done = threading.Event()
        threading.Thread(target=_stop_stragglers, args=(workdir, ranks, spec.linger_s, result, done),
                         daemon=True, name="mldebug-linger").start()
        failures: dict[int, int] = {}
        interrupted = False
        try:
            entry = [*spec.wrapper, "-m", "--"] if spec.wrapper else ["-m"]
            elastic_launch(config, sys.executable)("-u", *entry, WORKER_MODULE, *argv)
        except (DistError, RendezvousError) as e:  # the nodes never all met: no rank started anywhere
            raise _missing_nodes(spec, addr, port, e) from None
        except ChildFailedError as e:
            failures = {int(r): int(f.exitcode) for r, f in e.failures.items()}
        except SignalException as e:
            # torch's agent caught the signal and stopped the ranks; one from outside (Ctrl-C, kill, timeout,
            # scancel) interrupts the command like Ctrl-C, see docs/conventions.md
            if not result.timed_out and not result.stopped:
                lifecycle.note(e.sigval)
                interrupted = True
            elif not result.stopped:
                result.timed_out = True
        finally:
            done.set()
            lifecycle.restore(handlers)  # from here a signal interrupts through our handler, not torch's
        for rank in ranks:
            rc_file = os.path.join(workdir, f"rank{rank}.rc")
            if os.path.exists(rc_file):
                with open(rc_file) as fh:
                    result.exit_codes[rank] = int(fh.read().strip() or ExitCode.PROBLEM)
            else:
                result.exit_codes[rank] = failures.get(rank, KILLED)
            try:
                with open(os.path.join(workdir, f"rank{rank}.json")) as fh:
                    result.documents[rank] = fh.read()
            except OSError:
                pass
        if interrupted:
            raise SpawnInterrupted(result)
        return result
    finally:
        lifecycle.restore(handlers)
        if timer is not None:
            timer.cancel()
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(workdir, ignore_errors=True)
        os.close(workdir_lock)
