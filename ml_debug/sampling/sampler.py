"""One node's sample: its CPU, memory and load, its GPUs, and every rank process of the job.

The ranks are found the way dump-stacks finds them (:func:`ml_debug.procs.find_processes`: the
children of torchrun/srun/deepspeed/mpirun, labelled from /proc/PID/environ), again every few
seconds so a restarted job is picked up; between two searches only the known pids are read.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from typing import Any

from ml_debug import __version__
from ml_debug.sampling.options import SamplerOptions
from ml_debug.sampling.procstat import (
    CpuMeter,
    NodeCounters,
    node_cpu_percent,
    read_loadavg,
    read_meminfo,
    read_node_counters,
    read_proc_sample,
)
from ml_debug.sampling.progress import NOT_FOUND, FileProgress, ProgressReader
from ml_debug.sampling.sample import NodeInfo, NodeSample, ProgressFile, RankSample

AGENT_MARK = "MLDEBUG_TOP_AGENT"
"""Set in the environment of every agent, so that an agent never takes another one for a rank."""

REDISCOVER_S = 5.0
MAX_CMDLINE = 300

# mldebug's own commands that look at a job from beside it (often started by srun --overlap inside
# the job, with its SLURM_JOB_ID): never ranks. train, gpu-test, allreduce-bench and trace run AS ranks.
OBSERVERS = frozenset({"top", "watch", "dump-stacks", "health", "check", "env", "exec", "logs", "core-bt",
                       "trace-tail"})


def mldebug_command(cmdline: str) -> str | None:
    """The mldebug command a command line runs (``python -m ml_debug --json top ...`` -> "top"), or None."""
    words = cmdline.split()
    for i, w in enumerate(words):
        if os.path.basename(w) == "mldebug" or (w == "ml_debug" and i and words[i - 1] == "-m"):
            rest = [x for x in words[i + 1:] if not x.startswith("-")]
            return rest[0] if rest else None
    return None


def is_agent(cmdline: str, env: dict[str, str] | None) -> bool:
    """A `mldebug top --agent` (ours or another user's), or another mldebug command watching the job:
    never a rank."""
    return bool(env and AGENT_MARK in env) or mldebug_command(cmdline) in OBSERVERS


class NodeSampler:
    """Samples this node; one instance per agent, called once per interval."""

    def __init__(self, opts: SamplerOptions, gpu_sampler: Any = None, pids: Sequence[int] = ()) -> None:
        """``pids``: these processes (a launcher's pid means its ranks, as dump-stacks' --pid), not the pattern."""
        from ml_debug.sampling.gpus import GpuSampler

        self.opts = opts
        self.pids = list(pids)
        self.host = socket.gethostname()
        self.gpus = gpu_sampler if gpu_sampler is not None else GpuSampler()
        self.cpu = CpuMeter()
        self.progress = ProgressReader(opts.progress_files)
        self.processes: list[Any] = []
        self.notes: list[str] = []
        self._found_at = -1e9
        self._node_prev: NodeCounters | None = read_node_counters()
        self._agent_cpu_prev = time.process_time()
        self._agent_wall_prev = time.monotonic()
        self.seq = 0
        self.prime()

    def prime(self) -> None:
        """First readings of every rank and progress file, so the first sample already has rates."""
        now = time.monotonic()
        self.discover()
        for t in self.processes:
            s = read_proc_sample(t.pid)
            if s is not None:
                self.cpu.percent(s, now)
        if self.progress.patterns:
            found, _ = self.progress.paths_for((t.rank, t.local_rank) for t in self.processes)
            for path in found:
                self.progress.read(path, now)

    # -- rank processes -------------------------------------------------------------------------
    def discover(self) -> None:
        from ml_debug.procs import find_processes
        from ml_debug.procs.labels import read_environ

        found = find_processes(pids=self.pids or None, pattern=self.opts.pattern, user=self.opts.user,
                             env=self.opts.env_filter or None, host=self.host)
        self.processes = [t for t in found.processes if not is_agent(t.cmdline, read_environ(t.pid))]
        self.notes = list(found.notes)
        self._found_at = time.monotonic()

    def maintain(self) -> None:
        """The slow part, done between two ticks (never delaying a sample): look for the job's ranks
        again every few seconds, or at once when one of them exited."""
        if time.monotonic() - self._found_at >= REDISCOVER_S:
            self.discover()

    def _rank_rows(self, now: float) -> list[RankSample]:
        rows: list[RankSample] = []
        gone = False
        for t in self.processes:
            s = read_proc_sample(t.pid)
            if s is None or s.state in ("X",):
                gone = True
                continue
            cpu = self.cpu.percent(s, now)
            rows.append(RankSample(
                pid=t.pid, rank=t.rank, local_rank=t.local_rank, world_size=t.world_size, label=t.label,
                rank_source=t.rank_source, user=t.user, cmdline=t.cmdline[:MAX_CMDLINE], state=s.state,
                cpu_pct=None if cpu is None else round(cpu, 1), rss_bytes=s.rss_bytes, threads=s.threads))
        if gone:  # a rank exited: look again at the next sample (the job may be restarting)
            self._found_at = -1e9
        self.cpu.forget_except({r.pid for r in rows})
        return rows

    def _progress(self, rows: list[RankSample], now: float) -> tuple[list[ProgressFile], list[ProgressFile]]:
        """(the node's files: those of no rank, or of a rank that has one already; the files the patterns
        name that are not there). A file not there is kept apart from the others: for watch, a rank
        with a progress file is judged by that file alone, and a missing one must not make it stall."""
        if not self.progress.patterns:
            return [], []
        wall = time.time()
        found, missing = self.progress.paths_for((r.rank, r.local_rank) for r in rows)
        by_rank = {r.rank: r for r in rows if r.rank is not None}
        node_files: list[ProgressFile] = []
        for path, source in found.items():
            fp = self.progress.read(path, now)
            row = by_rank.get(source.rank) if source.rank is not None else None
            if row is not None and row.progress is None:
                row.progress = fp.as_sample(wall, source, has_rank=False)
            else:
                node_files.append(fp.as_sample(wall, source))
        self.progress.forget_except(found)
        absent = [FileProgress(path=path, error=NOT_FOUND).as_sample(wall, source)
                  for path, source in missing.items()]
        return node_files, absent

    # -- one sample -----------------------------------------------------------------------------
    def sample(self, tick: int | None = None) -> NodeSample:
        """This node now (:meth:`NodeSample.to_json` gives the line the agent sends)."""
        now = time.monotonic()
        self.seq += 1
        rows = self._rank_rows(now)
        gpus = self.gpus.sample()
        by_pid = {r.pid: r for r in rows}
        for g in gpus:
            for pid in g.pids or []:
                if pid in by_pid:
                    by_pid[pid].gpu = [*(by_pid[pid].gpu or []), g.index]
        node_files, absent = self._progress(rows, now)
        counters = read_node_counters()
        cpu_pct = node_cpu_percent(self._node_prev, counters)
        self._node_prev = counters
        mem_total, mem_used = read_meminfo()
        agent_cpu = time.process_time()
        agent_pct = 100.0 * (agent_cpu - self._agent_cpu_prev) / max(1e-6, now - self._agent_wall_prev)
        self._agent_cpu_prev, self._agent_wall_prev = agent_cpu, now
        return NodeSample(
            seq=self.seq, tick=tick, time=round(time.time(), 3), interval_s=self.opts.interval,
            node=NodeInfo(host=self.host, cpus=os.cpu_count(), cpu_pct=cpu_pct, load1=read_loadavg(),
                          mem_total_bytes=mem_total, mem_used_bytes=mem_used, agent_cpu_pct=round(agent_pct, 2)),
            nvml=self.gpus.status(), gpus=gpus, ranks=rows, progress=node_files, progress_missing=absent,
            notes=list(self.notes), mldebug_version=__version__)

    def close(self) -> None:
        self.gpus.close()
