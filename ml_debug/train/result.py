"""What a training run returns (:class:`TrainResult`, schema ``mldebug.train``) or raises.

Torch-free, so the CLI can render a result without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ml_debug.core.errors import ProblemFound

SCHEMA = "mldebug.train"


class NonFiniteError(ProblemFound):
    """A rank produced a NaN/Inf loss or gradient (raised on every rank, before the optimizer step)."""


class CollectiveFailure(ProblemFound):
    """A collective failed or timed out: a peer is hung, slow or gone."""


@dataclass
class TrainResult:
    """What one run did (rank 0's view; the per-rank detail is in METRICS_DIR)."""

    ok: bool
    summary: str
    preset: str
    numerics: str
    world_size: int
    device: str
    n_params: int
    start_step: int  # the step resumed from (0: a fresh start)
    last_step: int
    steps_run: int
    stopped_by: str  # completed, kill-switch
    losses: dict[int, float] = field(default_factory=dict)  # step -> loss (mean over ranks)
    final_loss: float | None = None
    tokens_per_s: float | None = None  # median per device, steps after the first
    tflops: float | None = None
    mfu: float | None = None
    step_time_s: float | None = None
    checkpoints: list[str] = field(default_factory=list)
    numerics_stats: dict[str, Any] | None = None
    profile_trace: str | None = None
    elapsed_s: float = 0.0
