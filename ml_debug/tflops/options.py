"""The options of `mldebug tflops` (cheap to import: no torch, no rich)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ml_debug.core.enums import Word
from ml_debug.core.options import option
from ml_debug.tflops.flops import parse_count

MODEL, RUN, HARDWARE = "Model", "Iteration", "Hardware"


class Formula(Word):
    """How FLOPs are counted."""

    PARAMS = "params"
    MEGATRON = "megatron"


class PeakKind(Word):
    """Which of the GPU's peaks MFU is measured against."""

    BF16 = "bf16"
    FP8 = "fp8"
    FP32 = "fp32"


@dataclass(frozen=True)
class TflopsOptions:
    """The options of `mldebug tflops`."""

    params: float | None = option(None, metavar="N", panel=MODEL, parse=parse_count, format=lambda n: f"{n:g}",
                                  help="Parameters of the model: 52B, 1.3B, 124M, 7e9.")
    hf_config: Path | None = option(None, metavar="FILE", panel=MODEL, dir_okay=False,
                                    help="A Hugging Face config.json: parameters, depth, width and vocabulary "
                                         "counted from it (instead of --params).")
    seq_len: int | None = option(None, min=1, panel=RUN,
                                 help="Tokens per sequence (adds the attention term; Megatron's formula needs it).")
    global_batch: int | None = option(None, min=1, panel=RUN,
                                      help="Sequences per iteration, all ranks together (micro batch x data "
                                           "parallel x gradient accumulation).")
    iter_time: float | None = option(None, min=1e-6, max=1e9, metavar="S", panel=RUN,
                                     help="Seconds per iteration.")
    metrics: Path | None = option(None, metavar="PATH", panel=RUN,
                                  help="mldebug train's --metrics-dir (or one rank-R.jsonl): the median "
                                       "iteration time and tokens per iteration come from it.")
    gpus: int | None = option(None, min=1, metavar="N", panel=HARDWARE,
                              help="GPUs in the job (default: 1, or the ranks in --metrics).")
    recompute: bool = option(False, flags=("--recompute/--no-recompute",), panel=MODEL,
                             help="Full activation recomputation (checkpointing): the forward runs twice, "
                                  "so hardware FLOPs are 8N per token instead of 6N.")
    formula: Formula = option(Formula.PARAMS, panel=MODEL,
                              help="params: 6N per token (+ attention when the shape is known); megatron: "
                                   "Megatron-LM's Equation 3 (needs --hf-config and --seq-len).")
    gpu: str | None = option(None, flags=("--gpu-model",), renamed_from=("--gpu",), metavar="NAME", panel=HARDWARE,
                             help="The GPU model for the peak, e.g. H100, A100, H100 PCIe (default: this "
                                  "node's first GPU, through NVML).")
    dtype: PeakKind = option(PeakKind.BF16, flags=("--peak-dtype",), renamed_from=("--dtype",), panel=HARDWARE,
                             help="The peak MFU is measured against: bf16, fp8 or fp32.")
