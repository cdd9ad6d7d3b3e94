"""Process-group init with a timeout, and a teardown that survives gloo's exit crash.

Equivalent of ``dist.init_process_group(backend, timeout=...)`` plus the environment torch's env://
rendezvous expects, filled in for Slurm and MPI worlds.
"""

from __future__ import annotations

import datetime as _dt
import gc
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ml_debug.core.errors import MLDebugError, PartialResult, ProblemFound, UsageError, first_line
from ml_debug.dist.device import DeviceChoice
from ml_debug.dist.world import World


def export_world_env(world: World) -> None:
    """Set RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* from the detected world (srun and mpirun set none)."""
    if not world.master_addr:
        raise UsageError(f"no master address for this {world.launcher} world of {world.world_size} ranks",
                         "export MASTER_ADDR=<host of rank 0> (and MASTER_PORT) for every rank")
    env = {"RANK": world.rank, "WORLD_SIZE": world.world_size, "LOCAL_RANK": world.local_rank,
           "LOCAL_WORLD_SIZE": world.local_world_size, "MASTER_ADDR": world.master_addr,
           "MASTER_PORT": world.master_port}
    for key, value in env.items():
        if world.launcher != "torchrun" or key not in os.environ:
            os.environ[key] = str(value)


def _resolves_locally(host: str) -> bool:
    """Does this host's name resolve to a non-loopback address (what gloo binds to by default)?"""
    try:
        return not socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


def route_interface(addr: str) -> str | None:
    """The local interface whose address routes to ``addr`` (``ip route get ADDR``)."""
    import psutil

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, 9))  # UDP: no packet is sent, only a route is chosen
            local_ip = s.getsockname()[0]
        for name, addrs in psutil.net_if_addrs().items():
            if any(a.address == local_ip for a in addrs):
                return name
    except OSError:
        return None
    return None


def pick_gloo_interface(world: World) -> str | None:
    """Set GLOO_SOCKET_IFNAME when gloo would otherwise fall back to loopback across hosts.

    gloo binds to the address of the hostname; when that does not resolve (or resolves to 127.x)
    it uses loopback and peers on other hosts get "Connection refused". The interface that routes to
    the master is the one every peer can reach. A value the user set is never changed.
    """
    if os.environ.get("GLOO_SOCKET_IFNAME") or not world.master_addr or world.nnodes < 2 \
            and world.launcher != "slurm":
        return None
    try:
        master_ip = socket.gethostbyname(world.master_addr)
    except OSError:
        return None
    if master_ip.startswith("127.") or _resolves_locally(socket.gethostname()):
        return None
    iface = route_interface(master_ip)
    if iface and iface != "lo":
        os.environ["GLOO_SOCKET_IFNAME"] = iface
    return iface


def is_timeout_error(e: BaseException) -> bool:
    text = str(e).lower()
    return "timed out" in text or "timeout" in text or type(e).__name__ in ("DistStoreError",)


def is_collective_error(e: BaseException) -> bool:
    """Did a collective (or the store under it) fail, because a peer is hung, slow or gone, rather than
    this rank's own code? gloo raises plain RuntimeErrors, so the message decides too."""
    text = str(e).lower()
    return type(e).__name__ in ("DistBackendError", "DistNetworkError", "DistStoreError") or any(
        w in text for w in ("gloo", "nccl", "timed out", "connection closed", "connection reset", "broken pipe"))


def init_process_group(world: World, choice: DeviceChoice, timeout_s: float, store: Any = None) -> None:
    """Initialise the default process group; every rank gives up after ``timeout_s``.

    Raises PartialResult (exit 4) when peers never arrive, ProblemFound (exit 1) otherwise, each
    with the next step to take.
    """
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    export_world_env(world)
    if choice.backend == "gloo":
        pick_gloo_interface(world)
    device_id = None
    if choice.is_cuda:
        torch.cuda.set_device(choice.index or 0)
        if choice.backend == "nccl":
            device_id = torch.device(choice.device)  # eager NCCL init: failures show up here
    kwargs: dict[str, Any] = {"backend": choice.backend, "rank": world.rank, "world_size": world.world_size,
                              "timeout": _dt.timedelta(seconds=timeout_s)}
    if store is not None:
        kwargs["store"] = store
    else:
        kwargs["init_method"] = "env://"
    if device_id is not None:
        kwargs["device_id"] = device_id
    try:
        dist.init_process_group(**kwargs)
    except Exception as e:
        where = f"{world.label} process-group init ({choice.backend}, {world.master_addr}:{world.master_port})"
        if is_timeout_error(e):
            raise PartialResult(
                f"{where} timed out after {timeout_s:g} s: {first_line(e)}",
                "some rank never joined: check every rank started and that MASTER_ADDR:MASTER_PORT is "
                "reachable from all hosts; rerun with NCCL_DEBUG=INFO (NCCL) or "
                "TORCH_DISTRIBUTED_DEBUG=DETAIL") from e
        raise ProblemFound(f"{where} failed: {first_line(e)}",
                           "rerun with NCCL_DEBUG=INFO TORCH_DISTRIBUTED_DEBUG=DETAIL; check "
                           "NCCL_SOCKET_IFNAME against `mldebug env` interfaces") from e
    from ml_debug.core.frfiles import DIR_VAR

    if os.environ.get(DIR_VAR):
        # launched with MLDEBUG_FR_DIR: answer dump-stacks' and watch's Flight Recorder requests
        import ml_debug.flight_recorder

        ml_debug.flight_recorder.enable()


def _barrier(timeout_s: float) -> None:
    import torch.distributed as dist

    if dist.get_backend() == "gloo":
        dist.monitored_barrier(timeout=_dt.timedelta(seconds=timeout_s), wait_all_ranks=True)
    else:
        work = dist.barrier(async_op=True)
        if work is not None:
            work.wait(timeout=_dt.timedelta(seconds=timeout_s))


def teardown(timeout_s: float = 10.0, barrier: bool = True) -> bool:
    """Destroy the process group without gloo's exit crash; True when it went cleanly.

    Callers drop their own tensors/models first (``del``); this collects garbage so no gloo worker
    thread still owns a tensor, waits at a bounded barrier so no peer is mid-collective, then destroys
    the group. Nothing here can block longer than about ``2 * timeout_s``.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return True
    clean = True
    gc.collect()
    if barrier and dist.get_world_size() > 1:
        try:
            _barrier(timeout_s)
        except Exception:
            clean = False
    gc.collect()
    done = threading.Event()

    def _destroy() -> None:
        try:
            dist.destroy_process_group()
        except Exception:
            pass
        finally:
            done.set()

    # destroy can block on a peer that died mid-collective; never let it hold the process.
    thread = threading.Thread(target=_destroy, name="mldebug-pg-destroy", daemon=True)
    thread.start()
    if not done.wait(timeout_s):
        return False
    return clean


@contextmanager
def distributed(world: World, choice: DeviceChoice, timeout_s: float, store: Any = None) -> Iterator[None]:
    """``with distributed(world, choice, 30): ...``: init, run, and always tear down safely."""
    init_process_group(world, choice, timeout_s, store=store)
    ok = False
    try:
        yield
        ok = True
    finally:
        teardown(timeout_s, barrier=ok)


__all__ = ["MLDebugError", "distributed", "export_world_env", "init_process_group", "teardown"]
