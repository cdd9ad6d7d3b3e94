"""A Llama-style decoder: RMSNorm, RoPE, SwiGLU, causal scaled_dot_product_attention.

Module names are stable (``tok_embeddings``, ``layers.N``, ``norm``, ``output``) so FSDP
wrapping, checkpoints and per-layer numerics stats can refer to them. Parameters are
initialised by :func:`init_weights` from a seed and each parameter's name, one full tensor
at a time, so the model is the same on any number of ranks (sharded or not).
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ml_debug.train.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_tables(head_dim: int, seq_len: int, theta: float, device: torch.device | str | None = None
                ) -> torch.Tensor:
    """cos/sin of RoPE angles, shape [seq_len, head_dim] (cos in the first half, sin in the second)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv)
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of ``x`` [B, T, H, D] by the angles in ``table``."""
    t = x.shape[1]
    half = table.shape[-1] // 2
    cos = table[:t, :half].view(1, t, 1, half)
    sin = table[:t, half:].view(1, t, 1, half)
    x32 = x.float().unflatten(-1, (half, 2))
    a, b = x32[..., 0], x32[..., 1]
    out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.n_kv_heads
        self.head_dim = cfg.dim // cfg.n_heads
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        if self.n_kv_heads != self.n_heads:
            rep = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)
        # Activation checkpointing is a flag, not a wrapper module, so parameter names (and so
        # checkpoints) are the same with and without it.
        self.checkpointed = False

    def _forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        if self.checkpointed and torch.is_grad_enabled():
            return checkpoint(self._forward, x, rope, use_reentrant=False)
        return self._forward(x, rope)


class Transformer(nn.Module):
    rope: torch.Tensor  # a buffer (registered in __init__); declared for the type checker

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        # Not persistent: recomputed by init_weights (after to_empty) and never checkpointed.
        self.register_buffer("rope", rope_tables(cfg.dim // cfg.n_heads, cfg.max_seq_len, cfg.rope_theta),
                             persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.rope)
        return self.output(self.norm(h))


def _param_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


def _init_value(name: str, shape: torch.Size, cfg: ModelConfig, seed: int) -> torch.Tensor:
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    std = 0.02
    if name.endswith(("wo.weight", "w2.weight")):
        std = 0.02 / math.sqrt(2 * cfg.n_layers)  # depth-scaled residual projections (GPT-2/torchtitan)
    elif name == "output.weight":
        std = cfg.dim**-0.5
    elif name == "tok_embeddings.weight":
        std = 1.0
    gen = torch.Generator().manual_seed(_param_seed(seed, name))
    return torch.nn.init.trunc_normal_(torch.empty(shape), std=std, a=-3 * std, b=3 * std, generator=gen)


@torch.no_grad()
def init_weights(model: Transformer, seed: int) -> None:
    """Initialise every parameter from (seed, its name); works on plain and FSDP-sharded params."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for name, param in model.named_parameters():
        # Generated on the CPU (the same numbers on every device type), then moved.
        full = _init_value(name, param.shape, model.cfg, seed).to(param.device)
        if isinstance(param, DTensor):
            # Each rank keeps only its shard of the same full tensor: no communication.
            local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
            param.to_local().copy_(local.to_local())
        else:
            param.copy_(full)
    device = model.rope.device
    model.rope = rope_tables(model.cfg.dim // model.cfg.n_heads, model.cfg.max_seq_len,
                             model.cfg.rope_theta, device=device)


def count_params(model: nn.Module, exclude_embedding: bool = True) -> int:
    """Parameters of the model (global, even when sharded); the embedding lookup costs no FLOPs."""
    total = 0
    for name, p in model.named_parameters():
        if exclude_embedding and name.endswith("tok_embeddings.weight"):
            continue
        total += p.numel()
    return total
