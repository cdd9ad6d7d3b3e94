"""`mldebug attach` on this node: find the process, check that it can be attached, read it, detach.

The remote path (``--hosts``/``--slurm-job``) runs this same function on every node as
``mldebug --json attach --rank R ... --local`` and keeps the node that runs rank R: the debugger's
traffic never leaves that node (see ml_debug/debugger/remote.py).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

from ml_debug.core.errors import EnvironmentProblem, ExitCode, MLDebugError, UsageError
from ml_debug.core.lifecycle import alive
from ml_debug.debugger.dap import DapError
from ml_debug.debugger.options import AttachOptions
from ml_debug.debugger.result import AttachResult, Evaluation, ThreadInfo
from ml_debug.debugger.session import AdapterLink, Link, Session

Prompt = Callable[[Session, AttachResult], None]


class RankNotHere(UsageError):
    """--rank R names no process on this node (with the ranks it does run, for a remote caller)."""

    def __init__(self, message: str, hint: str | None, ranks: list[int]) -> None:
        super().__init__(message, hint)
        self.ranks = ranks


def find_pid(opts: AttachOptions) -> tuple[int, int | None, list[int]]:
    """(pid, rank, ranks on this node) for --pid or --rank; UsageError when there is no such process."""
    from ml_debug.procs import find_processes
    from ml_debug.procs.find import is_python
    from ml_debug.procs.tree import read_proc

    if (opts.pid is None) == (opts.rank is None):
        raise UsageError("say which process: --pid PID or --rank R (one of them)",
                         hint="mldebug attach --pid 4242, or mldebug attach --rank 3 --slurm-job 12345")
    if opts.pid is not None:
        info = read_proc(opts.pid)
        if info is None:
            raise UsageError(f"pid {opts.pid}: no such process on {socket.gethostname()}",
                             hint="list the job's ranks with: mldebug dump-stacks")
        if opts.pid == os.getpid() or opts.pid in _ancestors():
            raise UsageError(f"pid {opts.pid} is mldebug itself or one of its parents")
        if not is_python(info):
            exe = os.path.basename(info.exe or (info.cmdline[0] if info.cmdline else "?"))
            raise UsageError(f"pid {opts.pid} ({exe}) is not a Python process: debugpy attaches to Python only",
                             hint="for native code: mldebug dump-stacks --pid PID --native, or gdb -p PID")
        from ml_debug.procs.labels import labels_from_environ, read_environ

        return opts.pid, labels_from_environ(read_environ(opts.pid)).rank, []
    found = find_processes(env=opts.env_filter or None)
    ranks = {t.rank: t.pid for t in found.processes if t.rank is not None}
    if opts.rank not in ranks:
        here = ", ".join(str(r) for r in sorted(ranks)) or "none"
        raise RankNotHere(f"rank {opts.rank} is not on {found.host} (ranks here: {here})",
                          "--hosts FILE or --slurm-job ID looks on every node of the job", sorted(ranks))
    assert opts.rank is not None
    return ranks[opts.rank], opts.rank, sorted(ranks)


def _ancestors() -> set[int]:
    out, pid = set(), os.getppid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def check_can_attach(pid: int) -> None:
    """debugpy importable, gdb present, ptrace allowed: EnvironmentProblem (exit 3) otherwise."""
    from ml_debug.core.extras import require
    from ml_debug.core.ptrace import check_ptrace

    require("debugpy", "mldebug attach")
    require("gdb", "mldebug attach (debugpy injects itself into a running process with gdb)")
    try:
        uid: int | None = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        uid = None
    denial = check_ptrace().denial(uid)
    if denial:
        reason, fix = denial
        raise EnvironmentProblem(f"cannot attach to pid {pid}: {reason}", hint=fix)


def attach_local(opts: AttachOptions, prompt: Prompt | None = None) -> AttachResult:
    """Attach on this node, read what the options ask, detach; MLDebugError for bad input.

    With --locate-only: find the process and check that it can be attached, nothing more (a remote
    prompt's first step: which node runs rank R)."""
    t0 = time.monotonic()
    pid, rank, ranks_here = find_pid(opts)
    check_can_attach(pid)
    if opts.locate_only:
        who = f"pid {pid}" + (f" (rank {rank})" if rank is not None else "")
        return AttachResult(ok=True, summary=f"{who} on {socket.gethostname()} can be attached",
                            exit_code=ExitCode.OK, host=socket.gethostname(), pid=pid, rank=rank, found=True,
                            ranks_here=ranks_here, alive_after=True, duration_s=round(time.monotonic() - t0, 2))
    return read_process(opts, pid, rank, ranks_here, socket.gethostname(), prompt=prompt)


def read_process(opts: AttachOptions, pid: int, rank: int | None, ranks_here: list[int], host: str,
                 prompt: Prompt | None = None, link: Callable[[], Link] = AdapterLink) -> AttachResult:
    """Attach to `pid` (on `host`, reached through `link`), read, serve the prompt if any, detach."""
    t0 = time.monotonic()
    result = AttachResult(ok=False, summary="", exit_code=ExitCode.OK, host=host, pid=pid,
                          rank=rank, found=True, ranks_here=ranks_here)
    who = f"pid {pid}" + (f" (rank {rank})" if rank is not None else "")
    session = Session(pid, opts.timeout, opts.attach_timeout, link=link)
    try:
        with session as s:
            result.threads = s.threads()
            result.thread = _pick_thread(result, opts.thread)
            result.stopped = s.stop(result.thread.id)
            if not result.stopped:
                result.exit_code = ExitCode.PARTIAL
                result.error = (f"thread {result.thread.name} did not stop within {opts.timeout:g} s: it is in "
                                "native code (a collective, a lock, a long sleep) and stops only when it runs "
                                "Python again")
                result.hint = f"see where with: mldebug dump-stacks --pid {pid} --native"
            else:
                _read(s, result, opts)
                if prompt is not None:
                    prompt(s, result)
    except DapError as e:
        if result.threads:
            result.exit_code, result.error = ExitCode.PARTIAL, e.message
        else:
            raise EnvironmentProblem(f"cannot debug {who}" + ("" if host == socket.gethostname() else f" on {host}")
                                     + f": {e.message}", hint=e.hint) from None
    result.alive_after = session.alive_after if isinstance(session.alive_after, bool) else \
        alive(pid) if host == socket.gethostname() else None
    result.duration_s = round(time.monotonic() - t0, 2)
    ev = result.evaluation
    if result.error:
        result.summary = f"{who} on {result.host}: {result.error}"
    elif ev is not None and ev.error:
        result.exit_code = ExitCode.PROBLEM
        result.summary = f"{who} on {result.host}: {ev.expression}: {ev.error}"
    elif ev is not None:
        result.summary = f"{who} on {result.host}: {ev.expression} = {ev.value}"
    else:
        top = result.frames[result.frame or 0] if result.frames else None
        result.summary = f"{who} on {result.host}: {result.thread.name if result.thread else '?'}" + (
            f" in {top.name} ({os.path.basename(top.file or '?')}:{top.line})" if top else "")
    result.ok = result.exit_code == ExitCode.OK
    return result


def _pick_thread(result: AttachResult, want: str | None) -> ThreadInfo:
    if not result.threads:
        raise DapError("the process has no Python thread the debugger can see")
    if want is None:
        return next((t for t in result.threads if t.name == "MainThread"), result.threads[0])
    for t in result.threads:
        if t.name == want or str(t.id) == want:
            return t
    names = ", ".join(f"{t.id} {t.name}" for t in result.threads)
    raise DapError(f"no thread {want!r} (threads: {names})")


def _read(s: Session, result: AttachResult, opts: AttachOptions) -> None:
    assert result.thread is not None
    tid = result.thread.id
    result.frames = s.stack(tid)
    index = opts.frame or 0
    if index >= len(result.frames):
        raise DapError(f"no frame {index}: the stack has {len(result.frames)} frame(s) (0 = innermost)")
    if opts.eval is not None:
        last: Evaluation | None = None
        # Without --frame, a name the innermost frame does not know is looked for in its callers: the
        # loop variable of `train()` while the rank sits in a helper it called.
        for i in ([index] if opts.frame is not None else range(index, len(result.frames))):
            last = s.evaluate(tid, i, opts.eval)
            if not (last.error and last.error.startswith("NameError")):
                break
        result.evaluation = last
        index = last.frame if last and last.frame is not None and not last.error else index
    result.frame = index
    result.locals = s.locals(tid, index)


def failed(opts: AttachOptions, e: MLDebugError) -> AttachResult:
    """The document a node prints when it could not attach (a remote caller reads why)."""
    return AttachResult(ok=False, summary=e.message, exit_code=e.exit_code, host=socket.gethostname(),
                        pid=opts.pid, rank=opts.rank, found=not isinstance(e, RankNotHere),
                        ranks_here=e.ranks if isinstance(e, RankNotHere) else [], error=e.message, hint=e.hint)
