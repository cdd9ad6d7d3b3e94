"""The per-step agreement: ONE small all_reduce after backward that every rank reads the same way.

Each rank contributes its non-finite flags, the partial sum of squares of its gradient shards, its
local loss and what it saw of the switch files. After the SUM every rank holds the same
:class:`StepAgreement`, so every rank takes the same decision (fail, save, stop) at the same step,
and a CPU/gloo step pays for one collective instead of several.

Layout of the float64 vector for a world of ``N`` ranks: rank ``r`` writes its loss flag at ``r`` and
its gradient flag at ``N + r`` (so the sum names the bad ranks), then ``N_SCALARS`` summed scalars
follow at ``2N + GRAD_SQ``, ``2N + LOSS``, ``2N + KILL`` and ``2N + SAVE``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

# Offsets of the summed scalars, after the 2N per-rank flags.
GRAD_SQ = 0  # sum of squares of the gradient (0 from a rank whose gradient is not finite)
LOSS = 1  # local mean loss (0 from a rank whose loss is not finite)
KILL = 2  # 1 from each rank that saw the kill switch file at the start of the step
SAVE = 3  # 1 from each rank that saw the save switch file
N_SCALARS = 4


@dataclass(frozen=True)
class Contribution:
    """One rank's share of a step's agreement."""

    loss: float  # this rank's mean loss over its micro-batches
    grad_sq: float  # sum of squares of this rank's gradient shards
    kill: bool
    save: bool

    @property
    def loss_bad(self) -> bool:
        return not math.isfinite(self.loss)

    @property
    def grad_bad(self) -> bool:
        return not math.isfinite(self.grad_sq)


@dataclass(frozen=True)
class StepAgreement:
    """The sum over ranks of every :class:`Contribution`: identical on every rank."""

    world_size: int
    loss_bad_ranks: list[int]
    grad_bad_ranks: list[int]
    grad_sq: float  # global sum of squares of the gradient
    loss_sum: float  # sum over ranks of each rank's local loss
    kill: bool  # some rank saw the kill switch
    save: bool  # some rank saw the save switch

    @property
    def finite(self) -> bool:
        return not self.loss_bad_ranks and not self.grad_bad_ranks

    @property
    def grad_norm(self) -> float:
        """Global L2 norm of the gradient (of all shards of all ranks)."""
        return math.sqrt(self.grad_sq)

    @property
    def loss(self) -> float:
        """Mean loss over ranks (every rank has the same number of tokens)."""
        return self.loss_sum / self.world_size


def pack(c: Contribution, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contribution as the float64 vector that is summed over ranks."""
    v = torch.zeros(2 * world_size + N_SCALARS, dtype=torch.float64)
    v[rank] = float(c.loss_bad)
    v[world_size + rank] = float(c.grad_bad)
    base = 2 * world_size
    # A non-finite value would poison the sum on every rank: the flags above carry the news instead.
    v[base + GRAD_SQ] = 0.0 if c.grad_bad else c.grad_sq
    v[base + LOSS] = 0.0 if c.loss_bad else c.loss
    v[base + KILL] = float(c.kill)
    v[base + SAVE] = float(c.save)
    return v


def unpack(v: torch.Tensor, world_size: int) -> StepAgreement:
    """Read the summed vector (on the CPU) back into named fields."""
    x = v.tolist()
    base = 2 * world_size
    return StepAgreement(
        world_size=world_size,
        loss_bad_ranks=[r for r in range(world_size) if x[r] > 0],
        grad_bad_ranks=[r for r in range(world_size) if x[world_size + r] > 0],
        grad_sq=x[base + GRAD_SQ],
        loss_sum=x[base + LOSS],
        kill=x[base + KILL] > 0,
        save=x[base + SAVE] > 0,
    )


def agree(c: Contribution, rank: int, world_size: int, device: torch.device | None) -> StepAgreement:
    """All-reduce (SUM) every rank's contribution on ``device`` (None: a single process, no collective)."""
    v = pack(c, rank, world_size)
    if device is not None:
        v = v.to(device)
        dist.all_reduce(v)
        v = v.cpu()
    return unpack(v, world_size)
