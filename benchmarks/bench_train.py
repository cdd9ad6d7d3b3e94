"""`mldebug train` throughput, measured side by side in one run.

* 2-rank FSDP2 (gloo, CPU) against a single-process plain PyTorch loop of the same model and the
  same global batch: total tokens/s ratio (>1: the two ranks together beat one process).
* Numerics overhead on one process: step time of bf16, fp8 (torchao, emulated here), MX fp8/fp4
  (our quantiser, emulated) against fp32 (ratio = slowdown).

    python benchmarks/run.py train
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.common import Result

PRESET = os.environ.get("MLDEBUG_BENCH_PRESET", "tiny")
STEPS = int(os.environ.get("MLDEBUG_BENCH_STEPS", "20"))
SEQ, PER_RANK = 128, 4


def _plain(numerics: str = "fp32", batch: int = 2 * PER_RANK, **kw: object) -> float:
    """Median step time (s) of the in-process, single-process, unsharded loop."""
    import torch

    from ml_debug.train.config import TrainConfig
    from ml_debug.train.loop import train

    torch.set_num_threads(1)
    cfg = TrainConfig(preset=PRESET, steps=STEPS, batch_size=batch, seq_len=SEQ, numerics=numerics,
                      log_every=10**6, stats_every=0, **kw)  # type: ignore[arg-type]
    result = train(cfg)
    assert result.step_time_s
    return result.step_time_s


def _fsdp_two_ranks() -> float:
    """Median step time (s) of 2 FSDP ranks, each with half the global batch."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "ml_debug", "train", "--nproc-per-node", "2", "--preset", PRESET,
                           "--steps", str(STEPS), "--batch-size", str(PER_RANK), "--seq-len", str(SEQ),
                           "--log-every", str(10**6), "--stats-every", "0", "--json"],
                          capture_output=True, text=True, env=env, timeout=900,
                          cwd=Path(__file__).resolve().parents[1])
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return float(json.loads(proc.stdout)["result"]["step_time_s"])


def run() -> list[Result]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    tokens = 2 * PER_RANK * SEQ
    plain = _plain()
    fsdp = _fsdp_two_ranks()
    results = [Result(f"train {PRESET}: 2-rank FSDP vs 1 plain process", plain / fsdp,
                      f"global batch {tokens} tokens: FSDP {tokens / fsdp:,.0f} tok/s total, "
                      f"plain {tokens / plain:,.0f} tok/s (>1: FSDP faster)")]
    base = _plain("fp32", batch=PER_RANK)
    for name, kw in (("bf16", {}), ("fp8", {}), ("mx", {"mx_format": "fp8_e4m3"}),
                     ("mx", {"mx_format": "fp4_e2m1", "mx_scale_mode": "rceil"})):
        t = _plain(name, batch=PER_RANK, **kw)
        label = name if name != "mx" else f"mx {kw['mx_format']}"
        results.append(Result(f"train {PRESET}: {label} step time vs fp32", t / base,
                              f"{t * 1e3:.1f} ms vs {base * 1e3:.1f} ms per step (CPU: emulated low-bit GEMMs)"))
    return results


if __name__ == "__main__":
    for r in run():
        print(r.line())
