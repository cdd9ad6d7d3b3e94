"""Sharded checkpoints with torch.distributed.checkpoint (DCP).

Layout: ``CHECKPOINT_DIR/step-N/`` holds DCP's files and, written last by rank 0 after every rank
has finished, ``COMPLETE``. A folder without it (a job killed mid-save) is never loaded and is
removed by the next save. The newest ``keep_last`` complete folders are kept.

The equivalent by hand: ``dcp.save(get_state_dict(model, opt), checkpoint_id=dir)``.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ml_debug.train.data import TokenStream

MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dirs(root: Path) -> list[tuple[int, Path, bool]]:
    """(step, folder, complete) for every step-N folder, oldest first."""
    if not root.is_dir():
        return []
    import os
    import stat

    uids = {os.geteuid(), os.getuid()}
    out = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if not m:
            continue
        try:
            st = os.lstat(p)
        except OSError:
            continue
        # only folders we made: DCP's metadata is a pickle, and a folder (or a link) that another user
        # planted in a shared directory would have us unpickle their file
        if stat.S_ISDIR(st.st_mode) and st.st_uid in uids:
            out.append((int(m.group(1)), p, (p / MARKER).is_file()))
    return sorted(out)


def latest_complete(root: Path) -> tuple[int, Path] | None:
    done = [(s, p) for s, p, ok in step_dirs(root) if ok]
    return done[-1] if done else None


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def save(root: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, stream: TokenStream,
         keep_last: int) -> Path:
    """Save step ``step`` collectively; returns the folder. Every rank must call it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = root / f"step-{step}"
    if _rank() == 0:
        _fresh_folder(root, folder.name)
    barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    t0 = time.perf_counter()
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder))
    barrier()  # every rank's shards are on disk before the marker says so
    if _rank() == 0:
        meta = {"step": step, "data": stream.state_dict(), "world_size": stream.world_size,
                "save_seconds": round(time.perf_counter() - t0, 3), "time": time.time()}
        from ml_debug.core import safefs

        with safefs.opened(safefs.open_out_dir(folder, "--checkpoint-dir")) as fd:
            safefs.replace_in(fd, "train_state.json", json.dumps(meta, indent=1).encode())
            safefs.replace_in(fd, MARKER, f"{step}\n".encode())
        _prune(root, keep_last)
    barrier()
    return folder


def _fresh_folder(root: Path, name: str) -> None:
    """A new, empty ``root/name`` that is ours. What is there already (a partial save of the same step
    from an earlier attempt, or, in a shared directory, a link or a folder another user planted) is
    removed by name, never followed: the shards are then written by path into a folder only we made."""
    import os
    import stat

    from ml_debug.core import safefs

    with safefs.opened(safefs.open_out_dir(root, "--checkpoint-dir")) as fd:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(name, dir_fd=fd)  # type: ignore[call-arg]  # by descriptors: no link followed
            else:
                os.unlink(name, dir_fd=fd)
        os.close(safefs.make_in(fd, name))


def _prune(root: Path, keep_last: int) -> None:
    entries = step_dirs(root)
    complete = [(s, p) for s, p, ok in entries if ok]
    newest = complete[-1][0] if complete else -1
    for _s, p in complete[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True)
    for s, p, ok in entries:
        if not ok and s < newest:  # leftovers of interrupted saves
            shutil.rmtree(p, ignore_errors=True)


def load(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, stream: TokenStream) -> int:
    """Load a complete step folder into model, optimizer and data stream; returns its step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    meta = json.loads((folder / "train_state.json").read_text())
    stream.load_state_dict(meta["data"])
    return int(meta["step"])


def load_full_from_rank0(model: nn.Module, path: Path, is_rank0: bool) -> None:
    """Low-memory start: rank 0 reads a full state dict (torch.save), every rank gets its shards by
    broadcast (the seeds' 405B recipe). Other ranks never hold the full model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full = torch.load(path, map_location="cpu", weights_only=True, mmap=True) if is_rank0 else {}
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))

