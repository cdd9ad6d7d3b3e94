"""`mldebug top --agent`: sample this node on every tick and print one JSON line, until told to stop.

The client starts one agent per node (over ssh, with ``srun --overlap``, or here) and reads its
stdout as a stream. Samples are taken on wall-clock ticks (multiples of the interval), so the
values of all nodes in one round describe the same moment.

The agent stops when its stdin reaches end of file (the ssh session or the client went away),
when stdout is closed (broken pipe), when it is re-parented (whatever started it died), or when
it is killed. It never waits for anything but its next tick.
"""

from __future__ import annotations

import json
import math
import os
import select
import stat
import sys
import time
from typing import IO, Any

from ml_debug.sampling.options import SamplerOptions


def _watch_stdin(fd: int) -> bool:
    """A pipe or socket from the client (ssh, srun, a parent) ends when the client leaves; /dev/null or a
    terminal (an agent started by hand) does not, and is not watched."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def first_tick(start: float, interval: float) -> int:
    """The first tick at least one interval (at most a second) away: CPU % and rates are measured
    from the readings taken at start, and a span that short would be noise."""
    return math.ceil((start + min(interval, 1.0)) / interval)


def run_agent(opts: SamplerOptions, out: IO[bytes] | None = None, stdin_fd: int = 0,
              sampler: Any = None, max_samples: int | None = None) -> int:
    """The agent loop; returns the exit code (0 when the client went away)."""
    from ml_debug.sampling.sampler import NodeSampler

    out = out if out is not None else sys.stdout.buffer
    interval = opts.interval
    sampler = sampler if sampler is not None else NodeSampler(opts)
    watch = [stdin_fd] if _watch_stdin(stdin_fd) else []
    parent = os.getppid()
    tick = first_tick(time.time(), interval)
    sent = 0
    try:
        while True:
            while True:
                left = tick * interval - time.time()
                if left <= 0:
                    break
                ready, _, _ = select.select(watch, [], [], left)
                if ready:
                    try:
                        data = os.read(stdin_fd, 4096)
                    except OSError:
                        data = b""
                    if not data:
                        return 0
                if os.getppid() != parent:
                    return 0
            line = json.dumps(sampler.sample(tick).to_json(), separators=(",", ":"), allow_nan=False)
            try:
                out.write(line.encode() + b"\n")
                out.flush()
            except (BrokenPipeError, OSError):
                return 0
            sent += 1
            if max_samples is not None and sent >= max_samples:
                return 0
            sampler.maintain()
            # A sample that took longer than an interval (a loaded node) skips ticks, never piles up.
            tick = max(tick + 1, math.floor(time.time() / interval) + 1)
    finally:
        sampler.close()
