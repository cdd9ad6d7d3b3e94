"""The training job's entry point: :func:`train`, which every rank runs.

This module owns what surrounds the training: absolute paths, the world, the kill switch present at
start, the fault set-up that must precede torch (a segfault's core folder), the process group and
its safe teardown. The training itself (build, ``train_step``, checkpoints, summary) is the
:class:`~ml_debug.train.trainer.Trainer`. Importing this module does not import torch.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ml_debug.train.config import TrainConfig
from ml_debug.train.result import SCHEMA, CollectiveFailure, NonFiniteError, TrainResult

if TYPE_CHECKING:
    from ml_debug.train.trainer import Trainer

__all__ = ["SCHEMA", "CollectiveFailure", "NonFiniteError", "TrainResult", "train"]


def _resolve_paths(cfg: TrainConfig) -> None:
    # A segfault injection chdirs to a per-rank core folder: make every user path absolute first.
    for name in ("metrics_dir", "checkpoint_dir", "kill_switch", "save_switch", "init_from", "profile_dir",
                 "core_dir"):
        path: Path | None = getattr(cfg, name)
        setattr(cfg, name, path.resolve() if path is not None else None)


def train(cfg: TrainConfig) -> TrainResult:
    """Run the job on this rank (under torchrun/srun/self-launch, or alone) and return rank 0's view.

    Equivalent by hand: ``torchrun --nproc-per-node N -m ml_debug.train --preset tiny``.
    """
    from ml_debug.dist.device import choose_device
    from ml_debug.dist.group import init_process_group, teardown
    from ml_debug.dist.world import detect_world

    t_start = time.perf_counter()
    _resolve_paths(cfg)
    world = detect_world()
    cfg.validate(world.world_size)
    if cfg.kill_switch is not None and cfg.kill_switch.exists():
        return TrainResult(True, f"kill switch {cfg.kill_switch} exists: not starting", cfg.preset, cfg.numerics,
                           world.world_size, "-", 0, 0, 0, 0, "kill-switch")

    from ml_debug.train.faults import FaultPlan, prepare_core_dir

    plan = FaultPlan(cfg.inject, world.rank)
    if plan.wants_core:
        prepare_core_dir(cfg.core_dir or Path("cores").resolve(), world.rank)

    choice = choose_device(world, cfg.device, cfg.backend)
    distributed = world.world_size > 1
    if distributed:
        init_process_group(world, choice, cfg.timeout)
    trainer: Trainer | None = None
    ok = False
    try:
        from ml_debug.train.trainer import Trainer

        trainer = Trainer(cfg, world, choice, plan)
        result = trainer.run()
        ok = True
        result.elapsed_s = round(time.perf_counter() - t_start, 3)
        return result
    finally:
        # Drop every tensor before destroying the group: a tensor that a gloo worker thread frees
        # during interpreter finalisation, after the group is gone, aborts the process.
        if trainer is not None:
            trainer.close()
        gc.collect()
        if distributed:
            teardown(timeout_s=min(cfg.timeout, 30.0), barrier=ok)
