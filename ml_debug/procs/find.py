"""Which processes to dump: the ranks under a launcher, or what --pid/--pattern/--user/--gpu-holders name.

The shell equivalent is ``pgrep -P $(pgrep -o torchrun)``, done properly: launchers are
recognised however they were started (``torchrun``, ``python -m torch.distributed.run``,
deepspeed, accelerate, srun/slurmstepd, mpirun/orted/hydra, mldebug's own
``mldebug <command> --nproc-per-node N``), wrapper shells between a launcher and its ranks are
walked through, a rank's own children (data loader workers, compile workers) are not taken as
ranks, and mldebug never picks itself.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from ml_debug.procs.labels import RankLabels, labels_from_environ, read_environ
from ml_debug.procs.selectors import compile_pattern
from ml_debug.procs.tree import ProcInfo, ProcTable, snapshot

# executable (or script) basenames of launchers
_LAUNCHER_NAMES = {
    "torchrun": "torchrun",
    "deepspeed": "deepspeed",
    "accelerate": "accelerate",
    "srun": "srun",
    "slurmstepd": "slurmstepd",
    "mpirun": "mpirun",
    "mpiexec": "mpirun",
    "mpiexec.hydra": "mpirun",
    "orterun": "mpirun",
    "orted": "mpirun",
    "prterun": "mpirun",
    "prted": "mpirun",
    "hydra_pmi_proxy": "mpirun",
}
# `python -m <module>` launchers
_LAUNCHER_MODULES = {
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torchrun",
    "deepspeed.launcher.launch": "deepspeed",
    "deepspeed.launcher.runner": "deepspeed",
    "accelerate.commands.launch": "accelerate",
    "accelerate.commands.accelerate_cli": "accelerate",
}
_LAUNCHER_SCRIPTS = ("torch/distributed/run.py", "torch/distributed/launch.py")
# mldebug's own self-launcher (`mldebug train --nproc-per-node 2`): its ranks are its children
_SELF_LAUNCH_FLAGS = ("--nproc-per-node", "--nproc_per_node")


# mldebug commands whose process is (or runs) a rank; any other mldebug command is a diagnostic tool
# (watch, top, dump-stacks ... started beside a job, maybe inside its allocation with its rank variables)
_RANK_COMMANDS = ("train", "gpu-test", "allreduce-bench", "trace")


def mldebug_tool(argv: list[str]) -> bool:
    """True for an mldebug diagnostic command (``mldebug watch``, ``python -m ml_debug dump-stacks``):
    never a rank, wherever it runs."""
    if not argv:
        return False
    rest: list[str] | None = None
    if _base(argv[0]) == "mldebug":
        rest = argv[1:]
    else:
        i = 1
        while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
            i += 1
        if i + 1 < len(argv) and argv[i] == "-m" and argv[i + 1] == "ml_debug":
            rest = argv[i + 2:]
        elif i < len(argv) and _base(argv[i]) == "mldebug" and _base(argv[0]).startswith(("python", "pypy")):
            rest = argv[i + 1:]
    if rest is None:
        return False
    command = next((a for a in rest if not a.startswith("-")), None)
    return command is not None and command not in _RANK_COMMANDS


def _self_launching(args: list[str]) -> bool:
    return any(a in _SELF_LAUNCH_FLAGS or a.startswith(tuple(f + "=" for f in _SELF_LAUNCH_FLAGS)) for a in args)


@dataclass
class FoundProcess:
    """One process to dump, with where it sits in the job."""

    pid: int
    host: str
    user: str
    cmdline: str
    exe: str | None
    found_by: str  # "torchrun pid 123", "pattern", "pid", "gpu", "rank env"
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    group_rank: int | None = None
    rank_source: str | None = None
    launcher_pid: int | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"


@dataclass
class Launcher:
    pid: int
    kind: str
    cmdline: str


@dataclass
class FoundProcesses:
    """What find_processes chose, and why the rest was left out."""

    host: str
    processes: list[FoundProcess] = field(default_factory=list)
    launchers: list[Launcher] = field(default_factory=list)
    skipped: list[dict[str, object]] = field(default_factory=list)  # {pid, cmdline, reason}
    notes: list[str] = field(default_factory=list)


def _base(path: str) -> str:
    return os.path.basename(path)


def is_python(info: ProcInfo) -> bool:
    """Python interpreter process (by its executable, or argv[0] when /proc/PID/exe is unreadable)."""
    names = [_base(info.exe)] if info.exe else []
    if info.cmdline:
        names.append(_base(info.cmdline[0]))
    return any(n.startswith(("python", "pypy")) for n in names)


def launcher_kind(info: ProcInfo) -> str | None:
    """The launcher this process is (torchrun, deepspeed, accelerate, srun, slurmstepd, mpirun, mldebug) or None."""
    argv = info.cmdline
    if info.name == "slurmstepd" or (argv and argv[0].startswith("slurmstepd")):
        return "slurmstepd"
    if not argv:
        return None
    kind = _LAUNCHER_NAMES.get(_base(argv[0]))
    if kind == "accelerate" and "launch" not in argv[1:3]:
        return None
    if kind:
        return kind
    if _base(argv[0]) == "mldebug" and _self_launching(argv[1:]):
        return "mldebug"
    if is_python(info):
        # python [-opts] -m module ... | python [-opts] script ...
        i = 1
        while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
            i += 1
        if i < len(argv) and argv[i] == "-m" and i + 1 < len(argv):
            if argv[i + 1] == "ml_debug" and _self_launching(argv[i + 2:]):
                return "mldebug"
            return _LAUNCHER_MODULES.get(argv[i + 1])
        if i < len(argv):
            script = argv[i]
            if _base(script) == "mldebug" and _self_launching(argv[i + 1:]):
                return "mldebug"
            if script.endswith(_LAUNCHER_SCRIPTS):
                return "torchrun"
            kind = _LAUNCHER_NAMES.get(_base(script))
            if kind == "accelerate" and "launch" not in argv[i + 1:i + 3]:
                return None
            return kind
    return None


def _found(info: ProcInfo, host: str, found_by: str, launcher_pid: int | None = None) -> FoundProcess:
    labels: RankLabels = labels_from_environ(read_environ(info.pid))
    return FoundProcess(pid=info.pid, host=host, user=info.user, cmdline=" ".join(info.cmdline) or f"[{info.name}]",
                  exe=info.exe, found_by=found_by, rank=labels.rank, local_rank=labels.local_rank,
                  world_size=labels.world_size, group_rank=labels.group_rank, rank_source=labels.rank_source,
                  launcher_pid=launcher_pid, env=labels.env)


def _ranks_under(table: ProcTable, launcher: ProcInfo, kind: str, host: str, out: FoundProcesses) -> list[FoundProcess]:
    """Python processes below a launcher: through wrapper shells, not into a rank's own children."""
    found: list[FoundProcess] = []
    stack = list(reversed(table.children.get(launcher.pid, [])))
    while stack:
        info = table.procs.get(stack.pop())
        if info is None:
            continue
        if launcher_kind(info) is not None:
            continue  # a nested launcher is walked on its own (srun -> torchrun -> ranks)
        if is_python(info):
            found.append(_found(info, host, f"{kind} pid {launcher.pid}", launcher.pid))
        elif info.state == "Z":
            out.skipped.append({"pid": info.pid, "cmdline": info.name, "reason": "exited (zombie)"})
        else:
            kids = table.children.get(info.pid, [])
            if not kids:
                out.skipped.append({"pid": info.pid, "cmdline": " ".join(info.cmdline) or info.name,
                                    "reason": "not a Python process"})
            stack.extend(reversed(kids))
    return found


def gpu_holder_pids() -> tuple[list[int], str | None]:
    """Pids holding a CUDA context on any GPU of this node (`nvidia-smi --query-compute-apps=pid`).

    Returns (pids, None), or ([], reason) when NVML cannot be used here (no GPU, no driver).
    """
    try:
        from ml_debug.core.nvml import is_na, open_gateway
    except Exception as e:  # the binding itself is missing
        return [], f"NVML unavailable: {type(e).__name__}: {e}"
    gw = open_gateway()
    status = gw.open()
    if not status.available:
        return [], status.reason
    pids: set[int] = set()
    try:
        count = gw.device_count()
        for i in range(0 if is_na(count) else int(count)):
            procs = gw.compute_processes(gw.handle(i))
            if not is_na(procs):
                pids.update(int(p[0]) for p in procs)
    finally:
        gw.close()
    return sorted(pids), None


def find_processes(*, pids: list[int] | None = None, pattern: str | None = None, user: str | None = None,
                   gpu: bool = False, include_launcher: bool = False, env: dict[str, str] | None = None,
                   host: str | None = None) -> FoundProcesses:
    """Choose the processes to dump on this node.

    With no selector: every rank under every launcher found; failing that, Python processes whose
    environment carries a rank variable; failing that, the processes holding a GPU.
    ``env`` keeps only processes whose environment has every KEY=VALUE given (one job among several:
    ``{"SLURM_JOB_ID": "123"}``, ``{"TORCHELASTIC_RUN_ID": "..."}``).
    """
    host = host or socket.gethostname()
    table = snapshot()
    out = FoundProcesses(host=host)
    me = os.getpid()
    excluded = {me, *table.ancestors(me)}  # never dump ourselves or the shell/srun that started us
    regex = compile_pattern(pattern) if pattern else None

    chosen: dict[int, FoundProcess] = {}

    def add(t: FoundProcess) -> None:
        if t.pid in excluded or t.pid in chosen:
            return
        info = table.procs.get(t.pid)
        if info is not None and mldebug_tool(info.cmdline):
            excluded.add(t.pid)
            out.skipped.append({"pid": t.pid, "cmdline": t.cmdline, "reason": "an mldebug diagnostic command"})
            return
        chosen[t.pid] = t

    launchers = {pid: kind for pid, info in table.procs.items()
                 if pid not in excluded and (kind := launcher_kind(info))}
    for pid, kind in sorted(launchers.items()):
        info = table.procs[pid]
        out.launchers.append(Launcher(pid, kind, " ".join(info.cmdline) or info.name))

    def expand_launcher(pid: int) -> None:
        info = table.procs[pid]
        for t in _ranks_under(table, info, launchers[pid], host, out):
            add(t)
        if include_launcher:
            add(_found(info, host, "launcher"))
        for child in table.descendants(pid):  # nested launchers: srun -> slurmstepd -> torchrun
            if child in launchers:
                for t in _ranks_under(table, table.procs[child], launchers[child], host, out):
                    add(t)

    if pids:
        for pid in pids:
            if pid not in table.procs:
                out.skipped.append({"pid": pid, "cmdline": "", "reason": "no such process on this node"})
            elif pid in excluded:
                out.skipped.append({"pid": pid, "cmdline": " ".join(table.procs[pid].cmdline),
                                    "reason": "mldebug itself or one of its parent processes"})
            elif pid in launchers:
                expand_launcher(pid)
            else:
                add(_found(table.procs[pid], host, "pid"))
    if regex is not None:
        for pid, info in sorted(table.procs.items()):
            if pid in excluded or not regex.search(" ".join(info.cmdline)):
                continue
            if pid in launchers and not include_launcher:
                continue
            if not is_python(info):
                out.skipped.append({"pid": pid, "cmdline": " ".join(info.cmdline), "reason": "not a Python process"})
                continue
            add(_found(info, host, "pattern"))
    if gpu:
        holders, why = gpu_holder_pids()
        if why:
            out.notes.append(f"--gpu-holders: {why}")
        for pid in holders:
            if pid in table.procs:
                add(_found(table.procs[pid], host, "gpu"))

    def in_env(t: FoundProcess) -> bool:
        return not env or all((read_environ(t.pid) or {}).get(k) == v for k, v in env.items())

    def owned(t: FoundProcess) -> bool:
        return t.user == user or str(_uid_of(t.pid)) == user

    def wanted(t: FoundProcess) -> bool:
        """Kept by --env and --user."""
        return in_env(t) and (user is None or owned(t))

    def none_wanted() -> bool:  # another job's ranks under a launcher must not hide the one --env names
        return not any(wanted(t) for t in chosen.values())

    if not pids and regex is None and not gpu:
        for pid in sorted(launchers):
            if not any(a in launchers for a in table.ancestors(pid)):
                expand_launcher(pid)
        if none_wanted():
            # Ranks whose launcher is gone (or started by hand): a rank variable in their environment.
            for pid, info in sorted(table.procs.items()):
                if pid in excluded or pid in launchers or not is_python(info):
                    continue
                if labels_from_environ(read_environ(pid)).rank is not None:
                    parent = table.procs.get(info.ppid)
                    if parent is not None and is_python(parent) and parent.pid not in launchers and \
                            labels_from_environ(read_environ(parent.pid)).rank is not None:
                        continue  # a rank's own child (data loader worker) inherits RANK
                    add(_found(info, host, "rank env"))
        if none_wanted():
            # Last resort: the GPU holders. That NVML is absent here is not news: --gpu-holders was not asked.
            holders, _ = gpu_holder_pids()
            for pid in holders:
                if pid in table.procs and pid not in excluded:
                    add(_found(table.procs[pid], host, "gpu"))

    processes = list(chosen.values())
    processes = [t for t in processes if in_env(t)]
    if user is not None:
        if not user.isdigit() and not _user_exists(user):  # a typo would look like "no job here"
            out.notes.append(f"--user {user}: no such user on {host}")
        for t in processes:
            if not owned(t):
                out.skipped.append({"pid": t.pid, "cmdline": t.cmdline, "reason": f"not owned by {user}"})
        processes = [t for t in processes if owned(t)]
    processes.sort(key=lambda t: (t.rank is None, t.rank if t.rank is not None else 0, t.pid))
    out.processes = processes
    return out


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _uid_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
