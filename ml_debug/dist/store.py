"""A key-value store shared by the ranks (torch's TCPStore), used to check in, name absent ranks
and gather results even when the process group itself is broken.

Under torchrun and self-launch the launcher's own store is reused (TORCHELASTIC_USE_AGENT_STORE);
otherwise rank 0 hosts it at MASTER_ADDR:MASTER_PORT.
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from collections.abc import Iterable
from typing import Any

from ml_debug.core.errors import PartialResult, UsageError, first_line
from ml_debug.dist.world import World


class StoreUnavailable(PartialResult):
    """The store's host (rank 0 or the launcher) cannot be reached or went away."""


def _prefix(world: World) -> str:
    env = os.environ
    run = env.get("TORCHELASTIC_RUN_ID") or (
        f"slurm{env.get('SLURM_JOB_ID', '')}.{env.get('SLURM_STEP_ID', '')}"
        if world.launcher == "slurm" else f"port{world.master_port}")
    return f"mldebug/{run}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"


def create_store(world: World, timeout_s: float) -> Any:
    """Connect to (or, on rank 0, host) the job's store; a PrefixStore private to this run.

    Fails with StoreUnavailable (exit 4) naming the address when rank 0's store never comes up.
    """
    import torch.distributed as dist

    if not world.master_addr:
        raise UsageError(f"no master address for this {world.launcher} world of {world.world_size} ranks",
                         "export MASTER_ADDR=<host of rank 0> (and MASTER_PORT) for every rank")
    use_agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    is_master = world.rank == 0 and not use_agent
    try:
        store = dist.TCPStore(world.master_addr, world.master_port, None, is_master,
                              _dt.timedelta(seconds=timeout_s), wait_for_workers=False)
    except Exception as e:  # RuntimeError / DistNetworkError / DistStoreError
        first = first_line(e)
        if is_master:
            raise StoreUnavailable(
                f"rank 0 could not listen on {world.master_addr}:{world.master_port}: {first}",
                "the port may be in use: pick another MASTER_PORT (or --master-port)") from e
        raise StoreUnavailable(
            f"{world.label} could not reach rank 0's store at {world.master_addr}:{world.master_port} "
            f"within {timeout_s:g} s: {first}",
            "rank 0 never started or is unreachable: check that it runs, that MASTER_ADDR resolves to it, "
            f"and `nc -zv {world.master_addr} {world.master_port}` from this host") from e
    return dist.PrefixStore(_prefix(world), store)


def wait_keys(store: Any, keys: Iterable[str], timeout_s: float, poll_s: float = 0.05) -> list[str]:
    """Wait until every key exists or the timeout passes; returns the keys still missing."""
    missing = list(keys)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            missing = [k for k in missing if not store.check([k])]
        except Exception as e:
            raise StoreUnavailable(f"the job's store went away: {first_line(e)}",
                                   "rank 0 (or the launcher hosting the store) probably died") from e
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
        poll_s = min(poll_s * 1.5, 0.5)


def store_set(store: Any, key: str, value: str) -> None:
    try:
        store.set(key, value)
    except Exception as e:
        raise StoreUnavailable(f"the job's store went away: {first_line(e)}",
                               "rank 0 (or the launcher hosting the store) probably died") from e


def store_get(store: Any, key: str) -> str:
    try:
        return store.get(key).decode()
    except Exception as e:
        raise StoreUnavailable(f"the job's store went away: {first_line(e)}",
                               "rank 0 (or the launcher hosting the store) probably died") from e
