"""One collective as a zero-argument call over preallocated buffers, and its deterministic data.

Verification data are small integers given by closed formulas of (rank, global element index),
so every rank can compute what it must receive without any communication, in chunks that bound
memory even for multi-GB buffers on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ml_debug.bench import bandwidth as bw
from ml_debug.core import testhooks

if TYPE_CHECKING:
    import torch

CHUNK = 1 << 24  # elements per verification chunk: bounds the int64 index temporaries


@dataclass
class Buffers:
    inp: torch.Tensor
    out: torch.Tensor | None  # None: in place (all_reduce, broadcast, reduce)

    @property
    def result(self) -> torch.Tensor:
        return self.out if self.out is not None else self.inp


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, bw.DTYPES[name][0])


def reduce_op(op: str) -> Any:
    import torch.distributed as dist

    return {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN, "avg": dist.ReduceOp.AVG}[op]


def allocate(lay: bw.Layout, dtype: str, device: str, fill: float | None = 0.0) -> Buffers:
    import torch

    td = torch_dtype(dtype)
    make = torch.zeros if fill == 0.0 else torch.empty
    inp = make(lay.in_count, dtype=td, device=device)
    out = make(lay.out_count, dtype=td, device=device) if lay.out_count else None
    return Buffers(inp, out)


def make_call(collective: str, bufs: Buffers, rank: int, n: int, op: str, root: int) -> Callable[[], None]:
    """A closure that runs the collective once (blocking as far as the backend's API goes)."""
    import torch.distributed as dist

    inp, out = bufs.inp, bufs.out
    if collective == "all_reduce":
        rop = reduce_op(op)
        return lambda: dist.all_reduce(inp, op=rop)
    if collective == "reduce":
        rop = reduce_op(op)
        return lambda: dist.reduce(inp, dst=root, op=rop)
    if collective == "broadcast":
        return lambda: dist.broadcast(inp, src=root)
    if collective == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(out, inp)
    if collective == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        rop = reduce_op(op)
        return lambda: scatter(out, inp, op=rop)
    if collective == "all_to_all":
        return lambda: dist.all_to_all_single(out, inp)
    if collective == "sendrecv":
        assert out is not None
        to, frm = (rank + 1) % n, (rank - 1) % n

        def ring() -> None:
            ops = [dist.P2POp(dist.isend, inp, to), dist.P2POp(dist.irecv, out, frm)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        return ring
    raise ValueError(f"unknown collective {collective!r}")


# ---- deterministic data -------------------------------------------------------------------------

def _sum_table(n: int) -> list[int]:
    return [sum((s + k) % 4 for s in range(n)) for k in range(4)]


def _minmax_table(n: int, fn: Callable[[list[int]], int]) -> list[int]:
    return [fn([(5 * s + k) % 11 for s in range(n)]) for k in range(11)]


def _value(kind: str, r: int, j: torch.Tensor, n: int) -> torch.Tensor:
    """Element values (int64) that rank r contributes at global indices j."""
    if kind == "sum":
        return (j + r) % 4
    if kind == "prod":
        return 1 + (j % n == r).to(j.dtype)
    if kind == "minmax":
        return (j + 5 * r) % 11
    if kind == "plain":
        return (j + 3 * r) % 7
    raise ValueError(kind)


def _pattern(op: str) -> str:
    return {"sum": "sum", "avg": "sum", "prod": "prod", "max": "minmax", "min": "minmax"}[op]


def _reduced(op: str, j: torch.Tensor, n: int) -> torch.Tensor:
    """What a reduction over all n ranks gives at global indices j (float64 for avg)."""
    import torch

    if op in ("sum", "avg"):
        table = torch.tensor(_sum_table(n), device=j.device)
        val = table[j % 4]
        return val.double() / n if op == "avg" else val
    if op == "prod":
        return torch.full_like(j, 2)
    table = torch.tensor(_minmax_table(n, max if op == "max" else min), device=j.device)
    return table[j % 11]


def _chunks(total: int) -> range:
    return range(0, total, CHUNK)


def fill_inputs(collective: str, bufs: Buffers, rank: int, n: int, op: str, root: int) -> None:
    """Write this rank's deterministic input (and a sentinel in outputs) for the verification pass."""
    import torch

    inp, device = bufs.inp, bufs.inp.device
    kind = _pattern(op) if collective in bw.REDUCING else "plain"
    block = inp.numel() // n if collective == "all_to_all" else 0
    for start in _chunks(inp.numel()):
        stop = min(start + CHUNK, inp.numel())
        j = torch.arange(start, stop, device=device, dtype=torch.int64)
        if collective == "broadcast" and rank != root:
            val = torch.full_like(j, 9)  # not a value the root sends: a missed broadcast shows
        elif collective == "all_to_all":
            dest = j // block  # block d goes to rank d
            val = (3 * rank + 5 * dest + j % block) % 13
        else:
            val = _value(kind, rank, j, n)
        inp[start:stop].copy_(val)
    if bufs.out is not None:
        bufs.out.fill_(9)


def expected_chunk(collective: str, rank: int, n: int, op: str, root: int, start: int, stop: int,
                   block: int, device: Any) -> torch.Tensor:
    """What this rank must hold in result[start:stop] after the collective (int64 or float64)."""
    import torch

    i = torch.arange(start, stop, device=device, dtype=torch.int64)
    if collective in ("all_reduce", "reduce"):
        return _reduced(op, i, n)
    if collective == "reduce_scatter":
        return _reduced(op, rank * block + i, n)
    if collective == "broadcast":
        return _value("plain", root, i, n)
    if collective == "all_gather":
        src = i // block
        return (i % block + 3 * src) % 7
    if collective == "all_to_all":
        src = i // block
        return (3 * src + 5 * rank + i % block) % 13
    if collective == "sendrecv":
        return _value("plain", (rank - 1) % n, i, n)
    raise ValueError(collective)


def tolerance(dtype: str, op: str, n: int) -> float:
    """Relative tolerance: 0 where every value is exact in the dtype, else rounding of n terms."""
    mantissa = bw.DTYPES[dtype][2]
    if mantissa is None:
        return 0.0
    eps = 2.0 ** -mantissa
    if op == "avg":
        return (n + 1) * eps
    if op == "sum" and 3 * n > 2 ** (mantissa + 1):
        return n * eps
    return 0.0


def count_wrong(collective: str, bufs: Buffers, rank: int, n: int, op: str, root: int, dtype: str) -> int:
    """Elements of this rank's result that differ from the expected values.

    The TEST-ONLY ``bench_verify_result`` hook (ml_debug.core.testhooks) sees the result first.
    """
    if collective == "reduce" and rank != root:
        return 0  # only the root's buffer is defined after a reduce
    res = bufs.result
    total = res.numel()
    # all_gather/all_to_all: one block per source rank; reduce_scatter: the result is this rank's block.
    block = total // n if collective in ("all_gather", "all_to_all") else total
    td = res.dtype
    if testhooks.active():
        testhooks.call(testhooks.BENCH_VERIFY_RESULT, rank=rank, collective=collective, result=res,
                       expected=lambda start, stop: expected_chunk(collective, rank, n, op, root, start, stop, block,
                                                                   res.device).to(td))
    rtol = tolerance(dtype, op, n)
    wrong = 0
    for start in _chunks(total):
        stop = min(start + CHUNK, total)
        exp = expected_chunk(collective, rank, n, op, root, start, stop, block, res.device)
        got = res[start:stop]
        if rtol == 0.0 and op != "avg":
            bad = got != exp.to(td)
        else:
            g, e = got.double(), exp.double()
            bad = ~((g - e).abs() <= rtol * e.abs().clamp_min(1.0))
        wrong += int(bad.sum().item())
    return wrong
