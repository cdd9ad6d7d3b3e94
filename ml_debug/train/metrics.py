"""Training metrics: FLOPs, MFU against a known peak table, memory, and the two log streams.

* rank 0 prints one human line per log step (stderr);
* every rank appends one JSON object per step to METRICS_DIR/rank-R.jsonl (schema
  ``mldebug.train.step`` v1), so other mldebug commands can read a job's progress.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ml_debug.train.config import ModelConfig

STEP_SCHEMA = "mldebug.train.step"

def peak_flops(device_name: str | None, numerics: str) -> float | None:
    """The device's dense peak FLOP/s for this numerics (fp32/bf16 -> bf16 peak, fp8/mx -> fp8), or None."""
    from ml_debug.core.gpu_peaks import peak_tflops

    peak = peak_tflops(device_name, "fp8" if numerics in ("fp8", "mx") else "bf16")
    return None if peak is None else peak * 1e12


def flops_per_token(cfg: ModelConfig, n_params: int, seq_len: int, recompute_fraction: float = 0.0
                    ) -> tuple[float, float]:
    """(model, hardware) training FLOPs per token.

    Model: 6N + 12*L*d*T (torchtitan; N without the embedding, attention scores and values).
    Hardware adds the recomputed forward under activation checkpointing: a checkpointed block
    runs its forward twice, 8N instead of 6N (the seeds' formula for full recomputation).
    """
    attn = 12 * cfg.n_layers * cfg.dim * seq_len
    model = 6 * n_params + attn
    hardware = model + recompute_fraction * (2 * n_params + attn / 3)
    return float(model), float(hardware)


def memory_peak() -> dict[str, int]:
    """Peak bytes: CUDA allocated/reserved on GPU ranks; the process's max RSS everywhere."""
    out = {"max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
            out["cuda_max_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
    except Exception:
        pass
    return out


@dataclass
class StepMetrics:
    """One step of one rank (a line of METRICS_DIR/rank-R.jsonl)."""

    step: int
    rank: int
    loss: float  # mean over ranks
    local_loss: float
    grad_norm: float
    lr: float
    tokens: int  # this rank's tokens this step
    step_time_s: float
    data_time_s: float
    tokens_per_s: float  # per device
    tflops: float  # model TFLOP/s per device
    hw_tflops: float  # with recomputation
    mfu: float | None
    memory: dict[str, int]
    time: float = field(default_factory=time.time)
    numerics_stats: dict[str, Any] | None = None
    event: str | None = None  # "checkpoint", "resume", "kill-switch" ...


def _fmt_num(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def human_line(m: StepMetrics, steps: int) -> str:
    mem = m.memory.get("cuda_max_allocated_bytes", m.memory.get("max_rss_bytes", 0))
    mfu = f"{m.mfu * 100:.1f}%" if m.mfu is not None else "n/a"
    width = len(str(steps))
    return (f"step {m.step:>{width}}/{steps} | loss {m.loss:.4f} | grad {m.grad_norm:.3f} | lr {m.lr:.2e} | "
            f"{_fmt_num(m.tokens_per_s)} tok/s | {m.tflops:.3g} TFLOP/s | mfu {mfu} | "
            f"step {m.step_time_s * 1e3:.0f} ms (data {m.data_time_s * 1e3:.1f} ms) | mem {mem / 2**20:,.0f} MiB")


class MetricsLog:
    """Writes the per-rank JSON lines and rank 0's human lines."""

    def __init__(self, metrics_dir: Path | None, rank: int, log_every: int, steps: int,
                 stream: TextIO | None = None) -> None:
        self.rank, self.log_every, self.steps = rank, log_every, steps
        self.stream = stream or sys.stderr
        self._fh: TextIO | None = None
        if metrics_dir is not None:
            from ml_debug.core import safefs

            # Append: a resumed run continues the same file. safefs: a link (or another user's file)
            # planted at the name in a shared directory is removed, never written through.
            fd, note = safefs.open_append(metrics_dir, f"rank-{rank}.jsonl", "--metrics-dir")
            self._fh = open(fd, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
            if note:
                self.stream.write(f"[mldebug train] rank {rank}: --metrics-dir: {note}\n")

    def step(self, m: StepMetrics) -> None:
        if self._fh is not None:
            record = {"schema": STEP_SCHEMA, "schema_version": 1, **asdict(m)}
            self._fh.write(json.dumps(_finite(record)) + "\n")
        if self.rank == 0 and (m.step % self.log_every == 0 or m.step == self.steps):
            self.say(human_line(m, self.steps))

    def say(self, text: str) -> None:
        if self.rank == 0:
            self.stream.write(f"[mldebug train] {text}\n")
            self.stream.flush()

    def event(self, text: str) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps({"schema": STEP_SCHEMA, "schema_version": 1, "rank": self.rank,
                                       "event": text, "time": time.time()}) + "\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj
