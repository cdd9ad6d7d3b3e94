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
import signal
import socket
import subprocess
import sys
import threading
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
                "started": None, "ended": None, "exit_code": None}
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


def _pump(src: IO[bytes], dst: IO[bytes], log: IO[bytes], lock: threading.Lock) -> None:
    for line in iter(src.readline, b""):
        with lock:
            log.write(line)
            log.flush()
        with contextlib.suppress(OSError, ValueError):  # the terminal may be gone; the log file is not
            dst.write(line)
            dst.flush()


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


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM torchrun (it stops its ranks); then SIGKILL it and its ranks by pid (each rank runs in its
    own session, so killing torchrun alone would leave them running)."""
    ranks = _children(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *ranks, *(c for r in ranks for c in _children(r))]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(STOP_GRACE_S)


def run(p: LaunchPlan, *, timeout: float | None = None, stdout: IO[bytes] | None = None,
        stderr: IO[bytes] | None = None) -> int:
    """Run torchrun for a prepared plan (:func:`prepare`), copying its output to the terminal and to
    console.log; torchrun's exit code."""
    env = {**os.environ, **p.env}
    env.pop("TORCHELASTIC_ERROR_FILE", None)  # torchrun gives each rank its own
    out = stdout or sys.stdout.buffer
    err = stderr or sys.stderr.buffer
    lock = threading.Lock()
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
        assert proc.stdout is not None and proc.stderr is not None
        pumps = [threading.Thread(target=_pump, args=(proc.stdout, out, log, lock), daemon=True),
                 threading.Thread(target=_pump, args=(proc.stderr, err, log, lock), daemon=True)]
        for t in pumps:
            t.start()
        deadline = time.monotonic() + timeout if timeout else None
        interrupted = False
        while True:
            try:
                held.release()  # the first time round: what came while torchrun started
                rc = proc.wait(0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() >= deadline:
                    # "error" and the time make `mldebug logs` read this line as the cause, at its time
                    now = _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
                    msg = f"mldebug launch: error: --run-timeout {timeout:g} s reached at {now}: stopping the job\n"
                    with lock:
                        log.write(msg.encode())
                    err.write(msg.encode())
                    _stop(proc)
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
                        proc.wait(STOP_GRACE_S)
                    except subprocess.TimeoutExpired:
                        _stop(proc)
                finally:
                    lifecycle.restore(saved)
                rc = proc.returncode if proc.returncode is not None else -signal.SIGKILL
                break
        for t in pumps:
            t.join(10)
        code = ExitCode.INTERRUPTED if interrupted else (rc if rc >= 0 else 128 - rc)
    p.manifest["ended"] = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    p.manifest["exit_code"] = code
    _write_manifest(p)
    return int(code)
