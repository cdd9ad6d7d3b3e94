"""FSDP2 wrapping, activation checkpointing, optimizer and learning-rate schedule.

Wrapping order (torchtitan's): each transformer block, the embedding, the final norm and output
projection together, then the root. Every group is one all-gather in forward and one
reduce-scatter in backward; the root holds nothing but makes FSDP2 schedule the others.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
from torch import nn

from ml_debug.train.config import TrainConfig
from ml_debug.train.model import Transformer, TransformerBlock


def apply_activation_checkpointing(model: Transformer, mode: str, every: int) -> int:
    """Mark blocks for recomputation: every block (full) or one in ``every`` (selective)."""
    count = 0
    for i, block in enumerate(model.layers.values()):
        on = mode == "full" or (mode == "selective" and i % every == 0)
        cast(TransformerBlock, block).checkpointed = on  # model.layers holds only blocks
        count += on
    return count


def compile_blocks(model: Transformer) -> int:
    """torch.compile every transformer block in place (before sharding, as torchtitan does): one
    graph per block type, reused by all blocks, so compile time does not grow with depth."""
    blocks = list(model.layers.values())
    for block in blocks:
        block.compile()
    return len(blocks)


def shard_model(model: Transformer, cfg: TrainConfig, mesh: Any) -> None:
    """fully_shard per block, embedding, norm+output, root (FSDP2), with the chosen policies."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if cfg.numerics in ("bf16", "fp8") or (cfg.numerics == "mx" and mesh.device_type == "cuda"):
        # bf16 compute and all-gathers, fp32 gradient reduction (sums of many ranks lose bits in bf16).
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    # pin_memory needs an accelerator: on a CPU-only host it fails ("Cannot access accelerator").
    offload: OffloadPolicy = (CPUOffloadPolicy(pin_memory=mesh.device_type == "cuda") if cfg.cpu_offload
                              else OffloadPolicy())
    common: dict[str, Any] = {"mesh": mesh, "mp_policy": mp, "offload_policy": offload}
    blocks = list(model.layers.values())
    for i, block in enumerate(blocks):
        # The last block's params are needed again at once by backward: keep them gathered.
        fully_shard(block, reshard_after_forward=cfg.reshard_after_forward and i < len(blocks) - 1, **common)
    fully_shard(model.tok_embeddings, reshard_after_forward=cfg.reshard_after_forward, **common)
    fully_shard([model.norm, model.output], reshard_after_forward=False, **common)
    fully_shard(model, reshard_after_forward=cfg.reshard_after_forward, **common)


def build_optimizer(model: nn.Module, cfg: TrainConfig, device_type: str) -> torch.optim.Optimizer:
    """AdamW; no weight decay on norms; fused on GPU, foreach on CPU unless told otherwise."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, p in model.named_parameters():
        (no_decay if name.endswith("norm.weight") else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    impl: str = cfg.optimizer_impl
    if impl == "auto":
        impl = "fused" if device_type == "cuda" else "foreach"
    kwargs: dict[str, Any] = {"lr": cfg.lr, "betas": cfg.betas, "eps": 1e-8}
    if impl == "fused":
        kwargs["fused"] = True
    else:
        kwargs["foreach"] = impl == "foreach"
    return torch.optim.AdamW(groups, **kwargs)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of (1-based) ``step``: linear warmup, then cosine/linear decay to lr*min_lr_ratio."""
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    if cfg.schedule == "linear":
        return floor + (cfg.lr - floor) * (1.0 - progress)
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def local_grads(model: nn.Module) -> list[torch.Tensor]:
    """This rank's gradient shards (DTensor locals), the only copy of those elements anywhere."""
    out = []
    for p in model.parameters():
        if p.grad is not None:
            g = p.grad
            out.append(g.to_local() if hasattr(g, "to_local") else g)
    return out


def grad_sq_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """Sum of squares of local grad shards (float64); global norm = sqrt(sum over ranks)."""
    if not grads:
        return torch.zeros((), dtype=torch.float64)
    norms = torch._foreach_norm([g.float() for g in grads], 2.0)
    return torch.stack([n.double() for n in norms]).pow(2).sum().cpu()


def clip_grads(grads: list[torch.Tensor], total_norm: float, max_norm: float) -> None:
    """Scale every shard by the same coefficient, computed from the global norm (as clip_grad_norm_)."""
    if max_norm <= 0 or not grads or not math.isfinite(total_norm):
        return
    coef = max_norm / (total_norm + 1e-6)
    if coef < 1.0:
        torch._foreach_mul_(grads, coef)
