"""Dump every target on this node, in parallel, once or several times (`--samples K --interval S`)."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from ml_debug.core.output import log, progress
from ml_debug.core.ptrace import PtraceCheck, check_ptrace
from ml_debug.procs.find import FoundProcess, FoundProcesses
from ml_debug.stacks.dumpers import DumpOptions, Tools, dump_process
from ml_debug.stacks.result import ProcessDump

MAX_PARALLEL = 32


@dataclass
class NodeDump:
    """What one node did: its targets, their samples, and why some are missing."""

    host: str
    ok: bool
    error: str | None = None
    targets: list[FoundProcess] = field(default_factory=list)
    samples: dict[int, list[ProcessDump]] = field(default_factory=dict)  # pid -> dumps in order
    launchers: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ptrace: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    rounds: int = 0  # sample rounds completed
    interrupted: bool = False  # Ctrl-C came during the samples: the rounds completed are kept
    kernel: dict[int, dict[str, Any]] = field(default_factory=dict)  # pid -> procs.kernel.KernelView, as JSON


def _uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def dump_processes(found: FoundProcesses, tools: Tools, opts: DumpOptions, samples: int = 1,
                   interval: float = 1.0, stop: threading.Event | None = None, kernel: bool = False,
                   strace_s: float = 0.0) -> NodeDump:
    """`py-spy dump --pid P` for every process found at once, `samples` times, `interval` seconds apart.

    Ctrl-C, or `stop` set by another thread (watch's bundle on Ctrl-C), ends the samples after the
    rounds completed, which are kept; with none completed, Ctrl-C propagates.
    """
    t0 = time.monotonic()
    check: PtraceCheck = check_ptrace()
    node = NodeDump(host=found.host, ok=True, targets=found.processes,
                      launchers=[asdict(launcher) for launcher in found.launchers], skipped=found.skipped,
                      notes=list(found.notes), ptrace=asdict(check))
    node.samples = {t.pid: [] for t in found.processes}
    uids = {t.pid: _uid(t.pid) for t in found.processes}
    if kernel:  # before the dumpers attach: py-spy and gdb stop the process, which changes what the kernel shows
        from ml_debug.procs.kernel import look_many

        views = look_many([t.pid for t in found.processes], strace_s=strace_s)
        node.kernel = {pid: asdict(v) for pid, v in views.items()}
    previous = _term_as_ctrl_c()
    try:
        _sample(node, found, tools, opts, check, uids, samples, interval, stop or threading.Event())
        if node.rounds < samples:  # `stop` was set
            raise KeyboardInterrupt
    except KeyboardInterrupt:  # keep the rounds completed (--out-dir's promise); none: a plain Ctrl-C
        if node.rounds == 0:
            raise
        for dumps in node.samples.values():
            del dumps[node.rounds:]  # the round cut short
        node.interrupted = True
        node.notes.append(f"interrupted (Ctrl-C) after {node.rounds} of {samples} samples: those are kept")
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    node.seconds = round(time.monotonic() - t0, 3)
    return node


def _term_as_ctrl_c() -> Any:
    """SIGTERM stops the samples like Ctrl-C (the rounds taken are kept and printed): it is how an
    agent on another node hears that the Ctrl-C came (its session closed, see remote.ssh), and how
    `kill` ends a long --samples run. The handler it replaced, or None off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum: int, _frame: Any) -> None:
        from ml_debug.core import lifecycle

        lifecycle.note(signum)  # the final line says which signal it was
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, stop)


def _sample(node: NodeDump, found: FoundProcesses, tools: Tools, opts: DumpOptions, check: PtraceCheck,
            uids: dict[int, int | None], samples: int, interval: float, stop: threading.Event) -> None:
    gone: set[int] = set()
    workers = max(1, min(MAX_PARALLEL, len(found.processes)))
    with ThreadPoolExecutor(max_workers=workers) as pool, \
            progress(samples * len(found.processes), f"dumping {len(found.processes)} processes") as bar:
        start = time.monotonic()
        for k in range(samples):
            # a fixed-rate schedule (not "interval after the last round ended"): dump rounds that take
            # a while do not stretch the spacing into a multiple of a looping rank's period
            delay = start + k * interval - time.monotonic()
            if stop.wait(max(0.0, delay)) and k > 0:
                return
            todo = [t for t in found.processes if t.pid not in gone]
            futures = {t.pid: pool.submit(dump_process, t.pid, tools, opts, check, uids[t.pid]) for t in todo}
            for pid, fut in futures.items():
                dump = fut.result()
                node.samples[pid].append(dump)
                bar.advance()
                if not dump.ok and dump.error and "exited" in dump.error:
                    gone.add(pid)  # no point asking a dead process again
            node.rounds = k + 1
            if samples > 1:
                ok = sum(1 for pid in futures if node.samples[pid][-1].ok)
                log(f"dump-stacks: {found.host}: sample {k + 1}/{samples} taken ({ok}/{len(futures)} dumped)")
