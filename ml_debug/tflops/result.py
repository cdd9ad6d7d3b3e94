"""What `mldebug tflops` reports (plain data; the JSON document is this, field for field)."""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA, SCHEMA_VERSION = "mldebug.tflops", 1


@dataclass
class TflopsReport:
    """Achieved TFLOP/s per GPU of one training setup, with what they were computed from."""

    ok: bool
    summary: str
    formula: str
    """How the FLOPs were counted, in symbols."""
    arithmetic: list[str]
    """The same with this run's numbers, one line per figure."""
    params: float
    params_source: str
    layers: int | None
    hidden: int | None
    vocab: int | None
    seq_len: int | None
    tokens_per_iteration: float
    iteration_s: float
    iteration_source: str
    gpus: int
    recompute: bool
    model_tflops: float
    """Model FLOPs (no recomputation counted) per second per GPU, in TFLOP/s."""
    hardware_tflops: float
    """FLOPs the GPUs executed (recomputation counted) per second per GPU."""
    gpu: str | None
    peak_kind: str
    peak_tflops: float | None
    mfu: float | None
    """model_tflops / peak_tflops; None without a known peak."""
    hfu: float | None
    tokens_per_s_per_gpu: float
    notes: list[str]
