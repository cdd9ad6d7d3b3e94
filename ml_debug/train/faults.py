"""Deterministic fault injection: each fault is the known target of one mldebug diagnostic.

Every fault runs inside a function whose name says what it is (``injected_hang`` ...), so a stack
dump, a core backtrace or a trace tail points straight at it.

=========  ====================================================  ==============================
fault      what rank R does at step S                            diagnosed by
=========  ====================================================  ==============================
hang       blocks forever in ``injected_hang`` (others wait in    dump-stacks (odd rank named)
           the next FSDP all-gather until the timeout)
straggler  sleeps (factor-1) x its step time every step from S    metrics (step_time per rank),
                                                                  allreduce-bench
crash      raises InjectedCrash (torchelastic error file)         torchrun's summary, trace
segfault   a real SIGSEGV (core in CORE_DIR/rank-R when           core-bt
           ``ulimit -c`` allows)
nan        a non-finite loss (or grad); every rank stops before   the job's own message, metrics
           the optimizer step naming rank R
desync     issues an all_reduce the others never issue            dump-stacks, TORCH_DISTRIBUTED_DEBUG
exit       exits at once, silently (os._exit)                     gpu-test, trace, torchrun
=========  ====================================================  ==============================
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import resource
import sys
import time
from pathlib import Path

from ml_debug.train.config import FaultSpec


class InjectedCrash(RuntimeError):
    """The exception ``crash`` raises (a stand-in for any Python bug in a training step)."""


def injected_hang(step: int, rank: int) -> None:
    """Block forever, on purpose, until killed."""
    sys.stderr.write(f"[mldebug train] rank {rank}: injected hang at step {step} (in injected_hang)\n")
    sys.stderr.flush()
    while True:
        time.sleep(3600)


def injected_straggler_delay(seconds: float) -> None:
    time.sleep(seconds)


def injected_crash(step: int, rank: int) -> None:
    raise InjectedCrash(f"injected crash on rank {rank} at step {step}")


def prepare_core_dir(core_dir: Path, rank: int) -> Path:
    """chdir to CORE_DIR/rank-R and lift the soft core limit, so this rank's core lands there
    (kernel.core_pattern 'core' is relative to the crashing process's cwd)."""
    from ml_debug.core import safefs

    where = Path(os.path.abspath(core_dir / f"rank-{rank}"))
    # the kernel writes the core by name in the cwd: the folder is reached by safefs's rules (no link
    # of another user followed, the folder ours or root's) and entered by its descriptor
    with safefs.opened(safefs.open_out_dir(where, "--core-dir")) as fd:
        os.fchdir(fd)
    _soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
    return where


def injected_segfault(step: int, rank: int) -> None:
    """A real SIGSEGV: read address 0 from C."""
    sys.stderr.write(f"[mldebug train] rank {rank}: injected segfault at step {step} "
                     f"(cwd {os.getcwd()}, core limit {resource.getrlimit(resource.RLIMIT_CORE)[0]})\n")
    sys.stderr.flush()
    faulthandler.enable()  # the Python stack on stderr as well as the core
    ctypes.string_at(0)


def injected_desync(step: int, rank: int) -> None:
    """An all_reduce that no other rank issues: the collective sequence diverges."""
    import torch
    import torch.distributed as dist

    sys.stderr.write(f"[mldebug train] rank {rank}: injected desync at step {step} (an extra all_reduce)\n")
    sys.stderr.flush()
    dist.all_reduce(torch.zeros(7))


def injected_exit(step: int, rank: int, code: int) -> None:
    """Leave at once: no message, no flush, no teardown (as an OOM kill or a stray exit() would)."""
    os._exit(code)


class FaultPlan:
    """The faults that concern this rank, fired at the right points of each step."""

    def __init__(self, faults: list[FaultSpec], rank: int) -> None:
        self.mine = [f for f in faults if f.rank == rank]
        self.rank = rank

    def due(self, kind: str, step: int) -> FaultSpec | None:
        for f in self.mine:
            if f.kind == kind and (f.step == step or (kind == "straggler" and step >= f.step)):
                return f
        return None

    @property
    def wants_core(self) -> bool:
        return any(f.kind == "segfault" for f in self.mine)

    def before_step(self, step: int, last_step_time: float) -> str | None:
        """Faults that strike at the start of a step (before the forward's first collective); returns
        what was done when the step goes on (for the metrics line)."""
        if self.due("hang", step):
            injected_hang(step, self.rank)
        if self.due("crash", step):
            injected_crash(step, self.rank)
        if self.due("segfault", step):
            injected_segfault(step, self.rank)
        exit_fault = self.due("exit", step)
        if exit_fault:
            injected_exit(step, self.rank, exit_fault.code)
        if self.due("desync", step):
            injected_desync(step, self.rank)
        straggler = self.due("straggler", step)
        if straggler and last_step_time > 0:
            delay = (straggler.factor - 1.0) * last_step_time
            injected_straggler_delay(delay)
            return f"injected straggler delay {delay:.3f} s (x{straggler.factor:g})"
        if self.due("nan", step):
            return "injected nan"
        return None

    def poison_loss(self, step: int) -> bool:
        f = self.due("nan", step)
        return f is not None and f.where == "loss"

    def poison_grad(self, step: int) -> bool:
        f = self.due("nan", step)
        return f is not None and f.where == "grad"
