"""Low-bit numerics for the block linears: MX (our quantiser), fp8 (torchao float8 training), and
per-layer saturation/underflow/amax statistics.

The MX linear quantises each of its three GEMMs along the GEMM's reduction dimension, as MX
hardware requires:

* forward      y  = x @ W^T      x and W along in_features
* grad input   dx = dy @ W       dy and W^T along out_features
* grad weight  dW = dy^T @ x     dy^T and x^T along tokens (so tokens must be a multiple of 32)

On hardware without MX GEMMs (everything before Blackwell, and CPUs) the GEMM runs on the
dequantised values: bit-exact emulation of the quantisation, ordinary GEMM accumulation.
The output layer stays in high precision (as torchtitan and the MX papers do).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from ml_debug.train import mx

KEEP_HIGH_PRECISION = ("output",)


@dataclass
class TensorStats:
    """Quantisation health of one tensor role (act, weight, grad) in one layer, summed over a step."""

    numel: int = 0
    saturated: int = 0
    underflow: int = 0
    amax: float = 0.0

    def add(self, numel: int, saturated: int, underflow: int, amax: float) -> None:
        self.numel += numel
        self.saturated += saturated
        self.underflow += underflow
        if amax == amax:  # skip NaN
            self.amax = max(self.amax, amax)

    def as_dict(self) -> dict[str, float]:
        n = max(self.numel, 1)
        return {"saturated_frac": self.saturated / n, "underflow_frac": self.underflow / n, "amax": self.amax}


def _role_stats(layer: object, role: str) -> TensorStats:
    """The step's running stats of ``role`` in ``layer`` (any linear: MX, torch or torchao)."""
    table: dict[str, TensorStats] = layer.__dict__.setdefault("_mldebug_stats", {})
    return table.setdefault(role, TensorStats())


class _StatsMixin:
    collect_stats: bool = False

    def _stats(self, role: str) -> TensorStats:
        return _role_stats(self, role)


class _MXMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, layer: MXLinear) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        ctx.save_for_backward(x2, weight)
        ctx.layer = layer
        ctx.shape = shape
        xq = layer.quant(x2, "act")
        wq = layer.quant(weight, "weight")
        return (xq @ wq.t()).reshape(*shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2, weight = ctx.saved_tensors
        layer: MXLinear = ctx.layer
        dy = grad_out.reshape(-1, weight.shape[0])
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            dyq = layer.quant(dy, "grad")  # along out_features
            wtq = layer.quant(weight.t().contiguous(), None)  # W^T along out_features
            grad_x = (dyq @ wtq.t()).reshape(ctx.shape)
        if ctx.needs_input_grad[1]:
            dytq = layer.quant(dy.t().contiguous(), None)  # along tokens
            xtq = layer.quant(x2.t().contiguous(), None)
            grad_w = (dytq @ xtq.t()).to(weight.dtype)
        return grad_x, grad_w, None


class MXLinear(nn.Linear, _StatsMixin):
    """nn.Linear whose GEMMs run on MX-quantised operands (same parameters, same state dict)."""

    mx_format: str = "fp8_e4m3"
    scale_mode: str = "floor"

    def quant(self, t: torch.Tensor, role: str | None) -> torch.Tensor:
        if self.collect_stats and role is not None:
            q = mx.quantize(t, self.mx_format, self.scale_mode, with_stats=True)
            self._stats(role).add(t.numel(), q.saturated, q.underflow, q.amax)
            return q.dequantize(t.dtype)
        return mx.fake_quantize(t, self.mx_format, self.scale_mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _MXMatmul.apply(x, self.weight, self)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mx={self.mx_format}/{self.scale_mode}"


def _block_linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and name not in KEEP_HIGH_PRECISION]


def apply_mx(model: nn.Module, mx_format: str, scale_mode: str) -> int:
    """Turn every block nn.Linear into an MXLinear in place (before sharding); returns how many."""
    count = 0
    for _, linear in _block_linears(model):
        linear.__class__ = MXLinear
        mx_linear = cast(MXLinear, linear)  # what the line above made it
        mx_linear.mx_format = mx_format
        mx_linear.scale_mode = scale_mode
        count += 1
    return count


def apply_fp8(model: nn.Module, emulate: bool) -> int:
    """torchao float8 training (tensorwise scaling) on every block linear; emulated off-GPU."""
    # torchao's import logs missing CUDA kernels and a pytree deprecation on every rank: noise here.
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig(emulate=emulate)
    convert_to_float8_training(model, config=config,
                               module_filter_fn=lambda _m, fqn: fqn not in KEEP_HIGH_PRECISION)
    return sum(1 for _ in _block_linears(model))


# ---- statistics for the layers torchao or plain torch run (fp32, bf16, fp8) ----------------------

_E4M3_MAX = 448.0
_E4M3_MIN_SUBNORMAL = 2.0**-9


def _hook_stats(module: nn.Module, args: tuple[Any, ...], _out: Any) -> None:
    if not getattr(module, "collect_stats", False) or isinstance(module, MXLinear):
        return
    with torch.no_grad():
        weight = cast(torch.Tensor, module.weight)  # the hook is only installed on linears
        for role, t in (("act", args[0]), ("weight", weight)):
            t = t.detach()
            to_local = getattr(t, "to_local", None)  # a DTensor (FSDP2 shard) -> its local tensor
            if to_local is not None:
                t = to_local()
            t = t.float()
            amax = float(t.abs().max()) if t.numel() else 0.0
            underflow = 0
            if getattr(module, "_mldebug_fp8", False) and amax > 0 and amax == amax:
                # tensorwise fp8: scale = 448 / amax, nothing saturates; tiny values flush to zero.
                scaled = t.abs() * (_E4M3_MAX / amax)
                underflow = int(((t != 0) & (scaled < _E4M3_MIN_SUBNORMAL / 2)).sum())
            _role_stats(module, role).add(t.numel(), 0, underflow, amax)


def install_stats_hooks(model: nn.Module, fp8: bool) -> None:
    for _, linear in _block_linears(model):
        if not isinstance(linear, MXLinear):
            # A plain instance attribute, as ``linear._mldebug_fp8 = fp8`` would set (nn.Module does
            # not declare the name, so the type checker refuses the attribute syntax).
            linear.__dict__["_mldebug_fp8"] = fp8
            linear.register_forward_hook(_hook_stats)


def set_collect_stats(model: nn.Module, on: bool) -> None:
    for _, linear in _block_linears(model):
        linear.__dict__["collect_stats"] = on  # a plain instance attribute, as in install_stats_hooks
        if on:
            linear.__dict__["_mldebug_stats"] = {}


def gather_stats(model: nn.Module) -> dict[str, dict[str, dict[str, float]]]:
    """{layer: {role: {saturated_frac, underflow_frac, amax}}} from the last stats step."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, linear in _block_linears(model):
        table = linear.__dict__.get("_mldebug_stats") or {}
        if table:
            out[name] = {role: s.as_dict() for role, s in table.items()}
    return out
