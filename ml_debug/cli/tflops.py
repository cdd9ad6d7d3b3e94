"""`mldebug tflops`: achieved TFLOP/s per GPU and MFU of a training setup."""

from __future__ import annotations

import typer

from ml_debug.tflops.options import TflopsOptions

HELP = """Achieved TFLOP/s per GPU and MFU from the model's size and the time per iteration.

FLOPs per token: 6N (forward 2N, backward 4N), 8N with full activation recomputation (the forward
runs twice), plus the attention term 12*L*h*s when --hf-config gives the depth and width; or
Megatron-LM's Equation 3 (--formula megatron). MFU is the model TFLOP/s over the GPU's dense peak
(detected through NVML, or --gpu-model); HFU counts the recomputed forward too. The iteration comes from
--iter-time/--global-batch/--seq-len, or from mldebug train's --metrics-dir.

Exit codes: 0 the figures; 2 bad or missing options."""

EXAMPLES = (
    "mldebug tflops --params 52B --seq-len 2048 --global-batch 1024 --iter-time 127 --gpus 64 --recompute --gpu-model A100",
    "mldebug tflops --hf-config config.json --seq-len 8192 --global-batch 512 --iter-time 9.8 --gpus 1024",
    "mldebug tflops --params 1.1B --metrics metrics/     # what `mldebug train --metrics-dir metrics` wrote",
)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "tflops", tflops, help=HELP, examples=EXAMPLES, opts=TflopsOptions)


def tflops(opts: TflopsOptions) -> int:
    from ml_debug.core import output
    from ml_debug.tflops.render import render
    from ml_debug.tflops.result import SCHEMA, SCHEMA_VERSION
    from ml_debug.tflops.run import estimate

    report = estimate(opts)
    output.emit(SCHEMA, SCHEMA_VERSION, report, lambda console: render(console, report))
    return 0
