"""MX (OCP Microscaling v1.0) quantisation: our own implementation, torch only.

A block of 32 consecutive values along the last dimension shares one E8M0 scale
(an 8-bit power of two, bias 127, 0xFF = NaN). Elements are fp8 (e4m3, e5m2), fp6
(e2m3, e3m2), fp4 (e2m1) or int8, rounded to nearest even and saturated.

Two ways to pick the scale:

* ``floor`` (the spec, section 6.3): ``X = 2^(floor(log2(amax)) - emax_elem)``;
  values above the element max after scaling saturate.
* ``rceil`` (NVIDIA cuBLAS / Blackwell hardware): ``X = 2^ceil(log2(amax / max_elem))``;
  nothing saturates, small values lose a little more precision.

For every format torchao also has, the scales and elements are bit-identical to
``torchao.prototype.mx_formats.mx_tensor.to_mx`` (tests/unit/train/test_mx_quantiser.py uses torchao as the
oracle) except in two corners where we follow the spec and torchao does not: a block whose
amax is so small that the scale clamps to 2^-127 (torchao divides by 2^-126 there) and, in
rceil mode, the same clamp (torchao multiplies by 1.0). Both need amax < ~2^-118.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32
E8M0_BIAS = 127
E8M0_NAN = 255
SCALE_MODES = ("floor", "rceil")


@dataclass(frozen=True)
class ElemFormat:
    """One MX element format."""

    name: str
    ebits: int  # 0 for int8
    mbits: int
    emax: int  # exponent of the largest power of two the element can hold
    max_pos: float
    torchao: str | None  # the matching torchao elem_dtype name, when torchao has the format

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal (the subnormal quantum is 2^(emin - mbits))."""
        return 1 - ((1 << (self.ebits - 1)) - 1)


FORMATS: dict[str, ElemFormat] = {
    "fp8_e4m3": ElemFormat("fp8_e4m3", 4, 3, 8, 448.0, "float8_e4m3fn"),
    "fp8_e5m2": ElemFormat("fp8_e5m2", 5, 2, 15, 57344.0, "float8_e5m2"),
    "fp6_e2m3": ElemFormat("fp6_e2m3", 2, 3, 2, 7.5, "fp6_e2m3"),
    "fp6_e3m2": ElemFormat("fp6_e3m2", 3, 2, 4, 28.0, "fp6_e3m2"),
    "fp4_e2m1": ElemFormat("fp4_e2m1", 2, 1, 2, 6.0, "float4_e2m1fn_x2"),
    # MXINT8: two's complement with an implicit 2^-6, so the range is [-2, 2); we saturate
    # symmetrically at +-127/64 as the spec allows, so negation never overflows.
    "int8": ElemFormat("int8", 0, 6, 0, 127.0 / 64.0, None),
}


@dataclass
class MXQuantized:
    """A tensor in MX form: one E8M0 code per block and elements on the format's grid.

    ``elements`` are float32 values exactly representable in the element format (so
    ``dequantize`` is exact); ``scale_code`` holds the biased E8M0 exponent as uint8.
    """

    scale_code: torch.Tensor  # uint8 [..., K // 32]
    elements: torch.Tensor  # float32 [..., K]
    fmt: ElemFormat
    saturated: int  # finite values whose magnitude exceeded the element max (clamped)
    underflow: int  # non-zero values that became zero
    amax: float

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self.scale_code, self.elements, dtype)


def scale_value(code: torch.Tensor) -> torch.Tensor:
    """E8M0 code -> float32 power of two (2^(code-127)); code 255 -> NaN."""
    value = torch.ldexp(torch.ones_like(code, dtype=torch.float32), code.to(torch.int32) - E8M0_BIAS)
    return torch.where(code == E8M0_NAN, torch.full_like(value, float("nan")), value)


def dequantize(code: torch.Tensor, elements: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    shape = elements.shape
    blocks = elements.reshape(*shape[:-1], shape[-1] // BLOCK, BLOCK)
    return (blocks * scale_value(code).unsqueeze(-1)).reshape(shape).to(dtype)


def _floor_log2(a: torch.Tensor) -> torch.Tensor:
    """Exact floor(log2(a)) for finite a > 0 (frexp avoids log2's rounding)."""
    return torch.frexp(a)[1].to(torch.int32) - 1


def round_elements(y: torch.Tensor, fmt: ElemFormat) -> torch.Tensor:
    """Round float32 ``y`` (already divided by the block scale) to the element grid.

    Round to nearest, ties to even; magnitudes above the element max saturate (Inf too);
    NaN stays NaN; the sign of zero is kept.
    """
    a = y.abs()
    if fmt.ebits == 0:  # int8: a fixed-point grid with quantum 2^-6
        q = torch.round(a * 64.0) / 64.0
    else:
        finite_pos = torch.where(torch.isfinite(a) & (a > 0), a, torch.ones_like(a))
        exp = torch.clamp(_floor_log2(finite_pos), min=fmt.emin)
        quantum = torch.ldexp(torch.ones_like(a), exp - fmt.mbits)
        # a / quantum is exact (power of two); torch.round is half-to-even.
        q = torch.round(a / quantum) * quantum
    q = torch.minimum(q, torch.tensor(fmt.max_pos, dtype=q.dtype))
    return torch.copysign(q, y)


def _scale_codes_floor(amax: torch.Tensor, fmt: ElemFormat) -> torch.Tensor:
    bits = amax.view(torch.int32)
    # The biased exponent field; denormals and zero read as -127, Inf as +128 (as torchao).
    exp = ((bits >> 23) & 0xFF) - 127
    unbiased = torch.clamp(exp - fmt.emax, min=-E8M0_BIAS, max=E8M0_BIAS)
    code = (unbiased + E8M0_BIAS).to(torch.uint8)
    return torch.where(torch.isnan(amax), torch.full_like(code, E8M0_NAN), code)


def _scale_codes_rceil(amax: torch.Tensor, fmt: ElemFormat) -> torch.Tensor:
    descale = amax / fmt.max_pos
    positive = torch.where(torch.isfinite(descale) & (descale > 0), descale, torch.ones_like(descale))
    mant, exp = torch.frexp(positive)  # positive = mant * 2^exp, mant in [0.5, 1)
    ceil_log2 = torch.where(mant == 0.5, exp - 1, exp).to(torch.int32)
    ceil_log2 = torch.where(descale > 0, ceil_log2, torch.full_like(ceil_log2, -E8M0_BIAS))
    code = (torch.clamp(ceil_log2, min=-E8M0_BIAS, max=E8M0_BIAS) + E8M0_BIAS).to(torch.uint8)
    code = torch.where(torch.isinf(descale), torch.full_like(code, 254), code)
    return torch.where(torch.isnan(descale), torch.full_like(code, E8M0_NAN), code)


def quantize(x: torch.Tensor, fmt: ElemFormat | str, scale_mode: str = "floor",
             with_stats: bool = True) -> MXQuantized:
    """Quantise ``x`` to MX along its last dimension (which must be a multiple of 32)."""
    if isinstance(fmt, str):
        fmt = FORMATS[fmt]
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"unknown MX scale mode {scale_mode!r} (choose from {', '.join(SCALE_MODES)})")
    if x.shape[-1] % BLOCK:
        raise ValueError(f"MX needs the quantised dimension to be a multiple of {BLOCK}, got {x.shape[-1]}")
    shape = x.shape
    blocks = x.detach().to(torch.float32).reshape(*shape[:-1], shape[-1] // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    if scale_mode == "floor":
        code = _scale_codes_floor(amax, fmt)
        y = blocks / scale_value(code)
    else:
        code = _scale_codes_rceil(amax, fmt)
        # Multiply by the reciprocal as the hardware does; Inf blocks use 2^-127 (cuBLAS).
        recip = torch.ldexp(torch.ones_like(amax), E8M0_BIAS - code.to(torch.int32))
        recip = torch.where(code == 254, torch.full_like(recip, 2.0**-127), recip)
        y = blocks * recip
    elements = round_elements(y, fmt)
    saturated = underflow = 0
    if with_stats:
        saturated = int((torch.isfinite(y) & (y.abs() > fmt.max_pos)).sum())
        underflow = int(((blocks != 0) & (elements == 0)).sum())
    finite = amax[torch.isfinite(amax)]
    return MXQuantized(code.squeeze(-1), elements.reshape(shape), fmt, saturated, underflow,
                       float(finite.max()) if finite.numel() else float("nan"))


def fake_quantize(x: torch.Tensor, fmt: ElemFormat | str, scale_mode: str = "floor") -> torch.Tensor:
    """Quantise then dequantise (the emulated MX GEMM input), in ``x``'s dtype."""
    return quantize(x, fmt, scale_mode, with_stats=False).dequantize(x.dtype)
