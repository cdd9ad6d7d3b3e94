"""torchrun with logs laid out for `mldebug logs`: every line labelled, per-rank files, error files.

What ``mldebug launch --nproc-per-node 8 -- python train.py --lr 1e-3`` runs on each node::

    python -m torch.distributed.run --nproc-per-node 8 --nnodes 1 --max-restarts 0 \\
        --role node12: --tee 3 --log-dir LOG_DIR/node12/torchelastic train.py --lr 1e-3

with ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[${role_name}${local_rank} rank${rank}]:'`` so that
every console line says its node, local rank and global rank (``[node12:5 rank37]:``); torchrun
sets TORCHELASTIC_ERROR_FILE for each rank itself once --log-dir is given (a script whose main is
wrapped in torch's ``@record`` writes its exception there). Its output goes to the terminal and to
``LOG_DIR/<host>/console.log``; ``LOG_DIR/<host>/launch.json`` says which node this is.

The host name is this process's own (``hostname -s``) and every argument travels as one element
of an argument list, so there is nothing to quote: no ``$(hostname -s)`` expanded on the wrong node,
no ``bash -c '...'`` inside srun.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import re
import select
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ml_debug.core import lifecycle
from ml_debug.core.errors import ExitCode, UsageError
from ml_debug.dist.options import debug_rank_argv
from ml_debug.launch.options import LaunchJobOptions
from ml_debug.logs.sources import LAUNCH_MANIFEST, LAUNCH_SCHEMA

PREFIX_TEMPLATE = "[${role_name}${local_rank} rank${rank}]:"
CONSOLE = "console.log"
TORCHELASTIC = "torchelastic"
FR_BUFFER = "2000"
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
STOP_GRACE_S = 30.0
DRAIN_S = 10.0
TERMINAL_BACKLOG = 8 << 20  # bytes kept for a terminal that does not take them now
_PIPE_BUF = 4096


@dataclass
class LaunchPlan:
    """What will run: torchrun's argument list, the environment it gets, where the logs go."""

    argv: list[str]
    env: dict[str, str]
    host: str
    node_dir: Path
    manifest: dict[str, Any] = field(default_factory=dict)


# --cuda-sync: what turns an asynchronous CUDA or NCCL error into one raised where it happened
CUDA_SYNC_ENV = {"CUDA_LAUNCH_BLOCKING": "1", "TORCH_USE_CUDA_DSA": "1", "TORCH_NCCL_BLOCKING_WAIT": "1"}


def short_hostname() -> str:
    """This node's name as ``hostname -s`` prints it."""
    return socket.gethostname().split(".")[0] or "localhost"


def default_log_dir(opts: LaunchJobOptions, now: _dt.datetime | None = None) -> Path:
    """mldebug-logs/<SLURM_JOB_ID>, or /<rdzv id>, or /<start time> (one node only: every node must agree)."""
    run = os.environ.get("SLURM_JOB_ID") or opts.rdzv_id
    if not run:
        run = (now or _dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    return Path("mldebug-logs") / run


def _target(opts: LaunchJobOptions) -> tuple[list[str], bool, bool]:
    """(command, module, no_python): ``python -m x`` and ``python x.py`` in the command are understood; a
    Python given other options of its own (``python -c CODE``, ``python -X dev x.py``) runs as a program, as
    written: torchrun would take them for its own."""
    cmd = list(opts.command)
    module, no_python = opts.module, opts.no_python
    if cmd and not module and not no_python and _PYTHON.match(os.path.basename(cmd[0])):
        if cmd[1:2] == ["-u"]:  # unbuffered: PYTHONUNBUFFERED is set anyway
            cmd = cmd[:1] + cmd[2:]
        if cmd[1:2] == ["-m"]:
            module, cmd = True, cmd[2:]
        elif cmd[1:2] and cmd[1].startswith("-"):
            if opts.trace:
                raise UsageError(f"--trace runs `python SCRIPT` or `python -m MODULE`, not python {cmd[1]}",
                                 "put the code in a file and run `python FILE`, or drop --trace")
            no_python = True
        else:
            cmd = cmd[1:]
    if not cmd:
        raise UsageError("no script to run", "mldebug launch --nproc-per-node 4 -- python train.py ARGS "
                                             "(or -- python -m package.module ARGS)")
    if module and no_python:
        raise UsageError("-m and --no-python together", "a module is run by Python; --no-python runs a program")
    return cmd, module, no_python


def plan(opts: LaunchJobOptions, host: str | None = None, environ: dict[str, str] | None = None) -> LaunchPlan:
    """The torchrun command line and environment for ``opts`` on this node (nothing is started)."""
    env_in = dict(os.environ if environ is None else environ)
    host = host or short_hostname()
    cmd, module, no_python = _target(opts)
    log_dir = opts.log_dir if opts.log_dir is not None else default_log_dir(opts)
    node_dir = (log_dir / host).absolute()
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(opts.nproc_per_node),
            "--nnodes", str(opts.nnodes), "--max-restarts", str(opts.max_restarts)]
    node_rank = opts.node_rank
    if node_rank is None and str(opts.nnodes) != "1" and opts.rdzv_backend is None \
            and env_in.get("SLURM_NODEID", "").isdigit():
        # under srun each node reads its own SLURM_NODEID here: nothing for a batch script to quote
        node_rank = int(env_in["SLURM_NODEID"])
    for flag, value in (("--node-rank", node_rank), ("--master-addr", opts.master_addr),
                        ("--master-port", opts.master_port), ("--rdzv-backend", opts.rdzv_backend),
                        ("--rdzv-endpoint", opts.rdzv_endpoint), ("--rdzv-id", opts.rdzv_id)):
        if value is not None:
            argv += [flag, str(value)]
    rendezvous = (opts.node_rank, opts.master_addr, opts.master_port, opts.rdzv_backend, opts.rdzv_endpoint)
    if opts.standalone or (str(opts.nnodes) == "1" and all(v is None for v in rendezvous)):
        # one node: a free port of its own, never torchrun's default 29500 that another job may hold
        argv.append("--standalone")
    argv += ["--role", f"{host}:", "--tee", "3", "--log-dir", str(node_dir / TORCHELASTIC), *opts.torchrun_arg]
    env: dict[str, str] = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": PREFIX_TEMPLATE, "PYTHONUNBUFFERED": "1"}
    if opts.debug_rank is not None:  # every rank through ml_debug.debugger.rank: R listens, all wait longer
        if no_python or opts.trace:
            raise UsageError("--debug-rank runs a Python script or module under debugpy, without --trace or "
                             "--no-python", "drop --trace, or launch the Python script itself")
        from ml_debug.core.extras import require

        require("debugpy", "mldebug launch --debug-rank")  # here, not as N ranks' ModuleNotFoundError
        cmd = [sys.executable, *debug_rank_argv(opts.debug_rank, opts.debug_port, opts.debug_no_wait),
               *(["-m"] if module else []), "--", *cmd]
        module, no_python = False, True
    if opts.trace:
        if no_python:
            raise UsageError("--trace runs a Python script or module, not a program (--no-python)",
                             "drop --trace, or launch the Python script itself")
        trace = [sys.executable, "-m", "ml_debug", "trace", "--ring", str(opts.trace_ring), "--idle-dump", "60",
                 "--out-dir", str(node_dir / "trace"), *(["-m"] if module else []), "--", *cmd]
        argv += ["--no-python", *trace]
    else:
        argv += [*(["-m"] if module else ["--no-python"] if no_python else []), *cmd]
    if opts.cuda_sync:
        env.update(CUDA_SYNC_ENV)
    if opts.flight_recorder:
        fr = node_dir / "fr"
        size = env_in.get("TORCH_FR_BUFFER_SIZE", "").strip()
        # an empty or non-numeric buffer size makes init_process_group hang or abort: never pass one on
        buffer = size if size.isdigit() and int(size) > 0 else FR_BUFFER
        env.update({"MLDEBUG_FR_DIR": str(fr), "TORCH_FR_BUFFER_SIZE": buffer, "TORCH_NCCL_TRACE_BUFFER_SIZE": buffer,
                    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": str(fr / "nccl_trace_rank_"),
                    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(fr / "nccl_trace_rank_"),
                    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(fr / "pipe_rank_")})
    manifest = {"schema": LAUNCH_SCHEMA, "schema_version": 1, "node": host, "node_rank": node_rank,
                "nnodes": opts.nnodes, "nproc_per_node": opts.nproc_per_node, "command": cmd, "module": module,
                "torchrun": argv, "prefix_template": PREFIX_TEMPLATE, "console": CONSOLE,
                "torchelastic": TORCHELASTIC, "trace": opts.trace, "flight_recorder": opts.flight_recorder,
                "cuda_sync": opts.cuda_sync,
                "started": None, "ended": None, "exit_code": None, "signal": None}
    return LaunchPlan(argv=argv, env=env, host=host, node_dir=node_dir, manifest=manifest)


def _write_manifest(p: LaunchPlan) -> None:
    from ml_debug.core import safefs

    # safefs: a link planted at the name in a shared --log-dir is replaced, never written through
    safefs.write_out(p.node_dir, LAUNCH_MANIFEST, json.dumps(p.manifest, indent=2) + "\n", "--log-dir")


def prepare(p: LaunchPlan) -> None:
    """Create this node's log directory (refusing one that already holds a launch) and its manifest."""
    if (p.node_dir / CONSOLE).exists() or (p.node_dir / LAUNCH_MANIFEST).exists():
        raise UsageError(f"{p.node_dir} already holds the logs of a launch",
                         "give another --log-dir (or remove that directory)")
    p.manifest["started"] = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    try:
        from ml_debug.core import safefs

        safefs.make_out_dir(p.node_dir, "--log-dir")  # no link of another user followed on the way
        for sub in ("fr",) if p.manifest.get("flight_recorder") else ():
            safefs.make_out_dir(p.node_dir / sub, "--log-dir")
        _write_manifest(p)
    except (OSError, safefs.Refused, UsageError) as e:
        hint = e.hint if isinstance(e, UsageError) else None
        raise UsageError(f"cannot write the logs to {p.node_dir}: {e}", hint or "give a writable --log-dir") from None


class _Terminal:
    """One of this process's own streams (the terminal, a pipe), written without ever blocking the loop that
    waits for torchrun: what it does not take now waits, up to TERMINAL_BACKLOG bytes, until it takes more."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._backlog = bytearray()
        self.dropped = 0
        self._fd: int | None = None
        with contextlib.suppress(OSError, ValueError):  # closed, or not a file (streams.prepare's stand-in)
            stream.flush()
            self._fd = stream.fileno()

    def put(self, data: bytes) -> None:
        if self._fd is None:
            with contextlib.suppress(OSError, ValueError):
                self._stream.write(data)
                self._stream.flush()
            return
        keep = max(0, TERMINAL_BACKLOG - len(self._backlog))
        self.dropped += max(0, len(data) - keep)
        self._backlog += data[:keep]

    @property
    def lost(self) -> int:
        """Bytes it has not taken: dropped, or still waiting."""
        return self.dropped + len(self._backlog)

    def push(self) -> bool:
        """Write what the stream takes now; True while some is left."""
        while self._backlog and self._fd is not None:
            if not select.select([], [self._fd], [], 0)[1]:
                return True
            try:
                n = os.write(self._fd, self._backlog[:_PIPE_BUF])  # a pipe ready for writing takes this much
            except BlockingIOError:
                return True
            except OSError:  # the terminal is gone; console.log is not
                self._fd = None
                self._backlog.clear()
                return False
            del self._backlog[:n]
        return False


class _Output:
    """torchrun's stdout and stderr, copied line by line to console.log and to this process's stdout and
    stderr, by this (main) thread while it waits for torchrun.

    No thread of its own: the kernel sends torchrun its parent-death signal (lifecycle.tie_to_this_process) once
    per thread of this process as a SIGKILL ends them one by one, and a second SIGTERM that lands inside
    torchrun's own shutdown leaves its log-tailing threads running, so that it never exits (seen under load:
    tests/cli/test_lifecycle.py). With this process single-threaded, torchrun gets one SIGTERM."""

    def __init__(self, proc: subprocess.Popen[bytes], out: IO[bytes], err: IO[bytes], log: IO[bytes]) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self._proc, self._log = proc, log
        self._terminals = (_Terminal(out), _Terminal(err))
        self._sel = selectors.DefaultSelector()
        for pipe, dst in zip((proc.stdout, proc.stderr), self._terminals, strict=True):
            self._sel.register(pipe, selectors.EVENT_READ, [dst, b""])  # where it goes, its unfinished line

    def wait(self, timeout: float | None) -> int:
        """Copy the output until torchrun exits and its pipes are closed (its exit code), or ``timeout`` s pass
        (subprocess.TimeoutExpired, as Popen.wait). Once torchrun has exited, its pipes are read for at most
        DRAIN_S more: a process it left behind may hold them open."""
        end = None if timeout is None else time.monotonic() + timeout
        drained_by = None
        while self._sel.get_map():
            now = time.monotonic()
            if drained_by is None and self._proc.poll() is not None:
                drained_by = now + DRAIN_S
            if drained_by is not None and now >= drained_by:
                break
            if end is not None and now >= end:
                raise subprocess.TimeoutExpired(self._proc.args, timeout or 0.0)
            behind = [t.push() for t in self._terminals]  # a terminal not taking its lines: looked at again soon
            tick = 0.05 if any(behind) else 0.5
            for key, _ in self._sel.select(min([tick, *(t - now for t in (end, drained_by) if t is not None)])):
                self._copy(key)
        return self._proc.wait(None if end is None else max(0.0, end - time.monotonic()))

    def _copy(self, key: selectors.SelectorKey) -> None:
        # an interrupt (KeyboardInterrupt, raised between any two steps) waits until the chunk read is in
        # console.log and queued for the terminal
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            chunk = os.read(key.fd, 1 << 16)
            dst, rest = key.data
            if not chunk:  # the pipe is closed: its last line, even without a newline
                self._sel.unregister(key.fileobj)
                lines = rest
            else:
                data = rest + chunk
                cut = data.rfind(b"\n") + 1
                key.data[1] = data[cut:]
                lines = data[:cut]  # whole lines only: stdout's and stderr's do not cut into each other
            self._out(lines, dst)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        dst.push()

    def say(self, line: str) -> None:
        """A line of mldebug launch's own, in console.log and on stderr among torchrun's."""
        self._out(line.encode(), self._terminals[1])
        self._terminals[1].push()

    def _out(self, lines: bytes, dst: _Terminal) -> None:
        if lines:
            self._log.write(lines)
            self._log.flush()
            dst.put(lines)

    def close(self) -> None:
        """Stop reading; give the terminal what it takes within a second or two, and say what it did not."""
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._sel.close()
        end = time.monotonic() + 2.0
        while any([t.push() for t in self._terminals]) and time.monotonic() < end:  # each one pushed
            time.sleep(0.05)
        lost = sum(t.lost for t in self._terminals)
        if lost:
            self._terminals[1].put(f"mldebug launch: the terminal did not take {lost} bytes of the job's output; "
                                   f"console.log has all of it\n".encode())
            self._terminals[1].push()


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            out.append(int(entry))
    return out


def _stop(proc: subprocess.Popen[bytes], output: _Output) -> None:
    """SIGTERM torchrun (it stops its ranks); then SIGKILL it and its ranks by pid (each rank runs in its
    own session, so killing torchrun alone would leave them running)."""
    ranks = _children(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        output.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *ranks, *(c for r in ranks for c in _children(r))]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        output.wait(STOP_GRACE_S)


def run(p: LaunchPlan, *, timeout: float | None = None, stdout: IO[bytes] | None = None,
        stderr: IO[bytes] | None = None) -> int:
    """Run torchrun for a prepared plan (:func:`prepare`), copying its output to the terminal and to
    console.log; torchrun's exit code."""
    env = {**os.environ, **p.env}
    env.pop("TORCHELASTIC_ERROR_FILE", None)  # torchrun gives each rank its own
    out = stdout or sys.stdout.buffer
    err = stderr or sys.stderr.buffer
    code: int = ExitCode.PROBLEM
    from ml_debug.core import safefs

    fd, _note = safefs.open_append(p.node_dir, CONSOLE, "--log-dir")  # a planted link: removed, not followed
    # a Ctrl-C or SIGTERM while torchrun starts is raised in the loop's try, which stops it
    with open(fd, "ab") as log, lifecycle.held_signals() as held:
        try:
            # torchrun gets SIGTERM (and stops its ranks) when this process dies, even by SIGKILL
            proc = held.popen(p.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                              stdin=subprocess.DEVNULL, preexec_fn=lifecycle.tie_to_this_process(signal.SIGTERM))
        except OSError as e:
            raise UsageError(f"cannot start torchrun: {e}", "is torch installed in this Python?") from e
        output = _Output(proc, out, err, log)
        deadline = time.monotonic() + timeout if timeout else None
        interrupted = False
        while True:
            try:
                held.release()  # the first time round: what came while torchrun started
                rc = output.wait(0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() >= deadline:
                    # "error" and the time make `mldebug logs` read this line as the cause, at its time
                    now = _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
                    output.say(f"mldebug launch: error: --run-timeout {timeout:g} s reached at {now}: stopping the job\n")
                    _stop(proc, output)
                    deadline = None
            except KeyboardInterrupt:
                # the terminal's SIGINT reached torchrun too (same process group): let it stop its ranks; a
                # SIGTERM (kill, timeout, scancel) is passed on. Further signals wait for the stop to end.
                interrupted = True
                sig = getattr(signal, lifecycle.interrupting_signal())
                saved = lifecycle.handlers()
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                try:
                    if sig != signal.SIGINT:
                        with contextlib.suppress(ProcessLookupError):
                            proc.send_signal(sig)
                    try:
                        output.wait(STOP_GRACE_S)
                    except subprocess.TimeoutExpired:
                        _stop(proc, output)
                finally:
                    lifecycle.restore(saved)
                rc = proc.returncode if proc.returncode is not None else -signal.SIGKILL
                break
        output.close()
        code = ExitCode.INTERRUPTED if interrupted else (rc if rc >= 0 else 128 - rc)
    p.manifest["ended"] = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    p.manifest["exit_code"] = code
    p.manifest["signal"] = lifecycle.interrupting_signal() if code == ExitCode.INTERRUPTED else None
    _write_manifest(p)
    return int(code)
