"""Verification data of allreduce-bench, checked in one process against a straight emulation of
each collective's semantics (no process group: the formulas alone), and the test-only fault hooks."""

from __future__ import annotations

import pytest
import torch

from ml_debug.bench import bandwidth as bw
from ml_debug.bench import ops
from ml_debug.core import testhooks
from ml_debug.core.errors import UsageError
from tests.fakes import faults


def _reduce(tensors: list[torch.Tensor], op: str) -> torch.Tensor:
    stack = torch.stack([t.double() for t in tensors])
    if op == "sum":
        return stack.sum(0)
    if op == "avg":
        return stack.sum(0) / len(tensors)
    if op == "prod":
        return stack.prod(0)
    return stack.amax(0) if op == "max" else stack.amin(0)


def _emulate(collective: str, inputs: list[ops.Buffers], n: int, op: str, root: int) -> None:
    """Write what the collective would leave in every rank's result buffer."""
    ins = [b.inp.clone() for b in inputs]
    for r, b in enumerate(inputs):
        res = b.result
        if collective == "all_reduce" or (collective == "reduce" and r == root):
            res.copy_(_reduce(ins, op).to(res.dtype))
        elif collective == "broadcast":
            res.copy_(ins[root])
        elif collective == "all_gather":
            res.copy_(torch.cat(ins))
        elif collective == "reduce_scatter":
            per = res.numel()
            res.copy_(_reduce(ins, op)[r * per:(r + 1) * per].to(res.dtype))
        elif collective == "all_to_all":
            per = res.numel() // n
            res.copy_(torch.cat([ins[s][r * per:(r + 1) * per] for s in range(n)]))
        elif collective == "sendrecv":
            res.copy_(ins[(r - 1) % n])


CASES = [(c, op, "float32") for c in bw.COLLECTIVES for op in (["sum", "prod", "max", "min", "avg"]
                                                                if c in bw.REDUCING else ["sum"])]
CASES += [("all_reduce", "sum", "bfloat16"), ("all_reduce", "sum", "int8"), ("reduce_scatter", "max", "uint8"),
          ("all_to_all", "sum", "float16"), ("all_gather", "sum", "int64")]


@pytest.mark.parametrize(("collective", "op", "dtype"), CASES)
@pytest.mark.parametrize("n", [2, 3])
def test_expected_values_match_collective_semantics(collective: str, op: str, dtype: str, n: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    root = n - 1
    lay = bw.layout(collective, 4096 + 12, bw.elem_size(dtype), n)
    bufs = [ops.allocate(lay, dtype, "cpu", fill=None) for _ in range(n)]
    for r, b in enumerate(bufs):
        ops.fill_inputs(collective, b, r, n, op, root)
    _emulate(collective, bufs, n, op, root)
    for r, b in enumerate(bufs):
        assert ops.count_wrong(collective, b, r, n, op, root, dtype) == 0, (collective, op, r)
    # A rank whose result is damaged is counted exactly (the test-only corrupt fault, through the hook).
    victim = root if collective == "reduce" else 1
    monkeypatch.setenv(testhooks.ENV, "tests.fakes.faults")
    monkeypatch.setenv(faults.ENV, f"allreduce-bench.corrupt:rank={victim},count=3;gpu-test.wrong-value:rank={victim}")
    assert ops.count_wrong(collective, bufs[victim], victim, n, op, root, dtype) == 3
    assert ops.count_wrong(collective, bufs[victim - 1], victim - 1, n, op, root, dtype) == 0  # another rank


def test_untouched_buffers_are_wrong() -> None:
    """A collective that did nothing must not pass: outputs hold a sentinel, inputs differ per rank."""
    n = 4
    for collective in ("all_reduce", "broadcast", "all_gather", "all_to_all", "sendrecv"):
        lay = bw.layout(collective, 1024, 4, n)
        b = ops.allocate(lay, "float32", "cpu", fill=None)
        ops.fill_inputs(collective, b, 1, n, "sum", 0)
        assert ops.count_wrong(collective, b, 1, n, "sum", 0, "float32") > 0, collective


def test_tolerance() -> None:
    assert ops.tolerance("float32", "sum", 8) == 0.0
    assert ops.tolerance("int8", "sum", 1000) == 0.0
    assert ops.tolerance("bfloat16", "sum", 128) > 0  # 3*128 > 256: sums are rounded in bf16
    assert ops.tolerance("float16", "avg", 2) > 0


def test_fault_specs() -> None:
    c, s, p = faults.parse("allreduce-bench.corrupt:rank=1,count=5; allreduce-bench.slow:rank=2,factor=4;"
                           "allreduce-bench.slow-pair:pair=3-0")
    assert (c.kind, c.rank, c.count, s.kind, s.rank, s.factor) == ("corrupt", 1, 5, "slow", 2, 4.0)
    assert p.pair == (0, 3) and p.factor == 3.0 and {c.command, s.command, p.command} == {"allreduce-bench"}
    assert p.remeasures is None  # slow in every re-measurement too: a persistently slow link
    (t,) = faults.parse("allreduce-bench.slow-pair:pair=2-3,factor=20,remeasures=0")
    assert (t.pair, t.factor, t.remeasures) == ((2, 3), 20.0, 0)
    assert faults.parse("") == () and faults.parse(None) == ()
    for bad in ("allreduce-bench.corrupt", "allreduce-bench.corrupt:rank=x", "allreduce-bench.explode:rank=1",
                "allreduce-bench.slow:factor=2", "allreduce-bench.slow-pair:pair=1", "corrupt:rank=1",
                "allreduce-bench.slow-pair:pair=1-2,remeasures=once",
                "gpu-test.corrupt:rank=1"):
        with pytest.raises(UsageError):
            faults.parse(bad)
