"""How many ranks one node can run: a rank count beyond it is refused before anything starts.

Each local rank is a Python process that imports torch (about 0.3-0.5 GB resident before any work) and
wants a CPU core. ``--nproc-per-node 100000`` once started 178 workers (18 GB) before it was killed: the
limit below turns that into one line and exit 2. ``--max-nproc-per-node`` (MLDEBUG_MAX_NPROC_PER_NODE)
raises or lowers it.
"""

from __future__ import annotations

import os

from ml_debug.core.errors import UsageError

RANKS_PER_CORE = 4
"""Oversubscription that still makes progress (CPU ranks on a small machine, a test of many ranks)."""
BYTES_PER_RANK = 512 << 20
"""What one rank needs at least: the interpreter, torch and a little work."""


def cpu_cores() -> int:
    """The cores this process may run on (its affinity: a Slurm step's or a container's share)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is none)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def node_limit() -> tuple[int, str]:
    """(most ranks this node can run, why): RANKS_PER_CORE per core, and no more than fit in the memory
    that is available now at BYTES_PER_RANK each (but at least one per core)."""
    cores = cpu_cores()
    limit, why = RANKS_PER_CORE * cores, f"{RANKS_PER_CORE} per CPU core, {cores} core(s)"
    avail = available_bytes()
    if avail is not None:
        by_memory = max(cores, avail // BYTES_PER_RANK)
        if by_memory < limit:
            limit, why = by_memory, f"{avail / 2**30:.1f} GiB available at {BYTES_PER_RANK >> 20} MiB a rank"
    return int(limit), why


RAISE = "--max-nproc-per-node N (MLDEBUG_MAX_NPROC_PER_NODE=N)"


def check_nproc(nproc: int, override: int | None = None, flag: str = "--nproc-per-node", raise_with: str = RAISE
                ) -> None:
    """UsageError (exit 2) when ``nproc`` local ranks are more than this node can run; ``override`` is the
    user's own limit (--max-nproc-per-node)."""
    if override is not None:
        limit, why = override, raise_with.split()[0].split("=")[0]
    else:
        limit, why = node_limit()
    if nproc > limit:
        raise UsageError(f"{flag} {nproc} is more ranks than this node can run (at most {limit}: {why})",
                         f"start fewer ranks per node, or raise the limit with {raise_with} if you know the node "
                         "can run them")
