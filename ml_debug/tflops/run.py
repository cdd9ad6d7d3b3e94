"""From options to a TflopsReport: the model's shape, the iteration, the GPU's peak."""

from __future__ import annotations

import json
import math
import stat
import statistics
from pathlib import Path
from typing import Any

from ml_debug.core.errors import UsageError
from ml_debug.core.gpu_peaks import peak_tflops
from ml_debug.tflops.flops import Shape, per_iteration, shape_from_hf_config
from ml_debug.tflops.options import Formula, TflopsOptions
from ml_debug.tflops.result import TflopsReport

MAX_CONFIG_BYTES = 4 << 20  # a config.json is a few KB; refuse a weights file given by mistake
MAX_METRICS_BYTES = 256 << 20


def _read_regular(path: Path, flag: str, limit: int) -> str:
    """A regular file's text, at most ``limit`` bytes (a FIFO or /dev/zero would never end)."""
    try:
        st = path.stat()
    except OSError as e:
        raise UsageError(f"{flag} {path}: {e.strerror}", "give the path of an existing file") from e
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{flag} {path} is not a regular file", "give the path of an existing file")
    if st.st_size > limit:
        raise UsageError(f"{flag} {path} is {st.st_size:,} bytes, more than {limit:,}",
                         "give the model's config.json or mldebug train's metrics lines")
    try:
        return path.read_text(errors="replace")
    except OSError as e:
        raise UsageError(f"{flag} {path}: {e.strerror}", "check its permissions") from e


def model_shape(opts: TflopsOptions) -> Shape:
    if opts.hf_config is not None and opts.params is not None:
        raise UsageError("--params and --hf-config both give the model's size", "give one of them")
    if opts.hf_config is not None:
        text = _read_regular(opts.hf_config, "--hf-config", MAX_CONFIG_BYTES)
        try:
            cfg = json.loads(text)
        except ValueError as e:
            raise UsageError(f"--hf-config {opts.hf_config} is not JSON: {e}", "give a config.json") from None
        except RecursionError:  # a config is a few levels deep; thousands of nested brackets are not one
            raise UsageError(f"--hf-config {opts.hf_config} is nested too deeply to be a model config",
                             "give the model's config.json") from None
        if not isinstance(cfg, dict):
            raise UsageError(f"--hf-config {opts.hf_config} is not a JSON object", "give a config.json")
        return shape_from_hf_config(cfg.get("text_config", cfg) if "hidden_size" not in cfg else cfg,
                                    str(opts.hf_config))
    if opts.params is not None:
        return Shape(opts.params)
    raise UsageError("the model's size is missing", "give --params N (e.g. 52B) or --hf-config config.json")


def metrics_files(path: Path) -> list[Path]:
    """rank-R.jsonl files of mldebug train's --metrics-dir, or the one file given."""
    if path.is_dir():
        files = sorted(path.glob("rank-*.jsonl"))
        if not files:
            raise UsageError(f"--metrics {path} holds no rank-R.jsonl file", "give mldebug train's --metrics-dir")
        return files
    return [path]


def from_metrics(path: Path) -> tuple[float, float, int, str]:
    """(median seconds per iteration, tokens per iteration of the whole job, ranks, where from).

    The first step pays for warm-up and compilation: it is left out when there are more."""
    files = metrics_files(path)
    steps: dict[int, tuple[float, int]] = {}
    for number, line in enumerate(_read_regular(files[0], "--metrics", MAX_METRICS_BYTES).splitlines(), 1):
        try:
            rec: Any = json.loads(line)
        except (ValueError, RecursionError):  # not a step line: train writes flat objects
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int) and isinstance(rec.get("step_time_s"), float | int) \
                and isinstance(rec.get("tokens"), int):
            # a time of 0 (a clock that did not move) divided the throughput by zero; a negative one gave a
            # negative throughput: neither is a step that ran
            if not (math.isfinite(rec["step_time_s"]) and rec["step_time_s"] > 0) or rec["tokens"] < 0:
                what = (f"step_time_s is {rec['step_time_s']}, not a positive time" if rec["tokens"] >= 0
                        else f"tokens is {rec['tokens']}, a negative count")
                raise UsageError(f"--metrics {files[0]} line {number} (step {rec['step']}): {what}",
                                 "give the metrics mldebug train wrote, or --iter-time S with --global-batch")
            steps[rec["step"]] = (float(rec["step_time_s"]), rec["tokens"])
    if not steps:
        raise UsageError(f"--metrics {files[0]} has no step lines", "give mldebug train's --metrics-dir after a run")
    kept = [steps[s] for s in sorted(steps)][1:] or list(steps.values())
    ranks = len(files)
    return (statistics.median(t for t, _ in kept), statistics.median(n for _, n in kept) * ranks, ranks,
            f"median of {len(kept)} step(s) in {files[0]}")


def detected_gpu() -> str | None:
    """This node's first GPU by NVML (`nvidia-smi -L`), or None."""
    from ml_debug.core.nvml import open_gateway

    with open_gateway() as gw:
        if not gw.open().available:
            return None
        name = gw.name(gw.handle(0))
        return name if isinstance(name, str) else None


def estimate(opts: TflopsOptions) -> TflopsReport:
    shape = model_shape(opts)
    notes: list[str] = []
    if opts.metrics is not None:
        if opts.iter_time is not None or opts.global_batch is not None:
            raise UsageError("--metrics gives the iteration: --iter-time and --global-batch are not used with it",
                             "drop --iter-time/--global-batch, or --metrics")
        iteration_s, tokens, ranks, where = from_metrics(opts.metrics)
        gpus = opts.gpus or ranks
        if opts.gpus and opts.gpus != ranks:
            tokens = tokens / ranks * opts.gpus
            notes.append(f"--gpus {opts.gpus}: tokens per iteration scaled from the {ranks} rank file(s) found")
    else:
        if opts.iter_time is None or opts.global_batch is None or opts.seq_len is None:
            raise UsageError("the iteration is missing",
                             "give --iter-time S, --global-batch B and --seq-len T (or --metrics DIR)")
        iteration_s, tokens, gpus = opts.iter_time, float(opts.global_batch * opts.seq_len), opts.gpus or 1
        where = "--iter-time"
    flops = per_iteration(shape, tokens, opts.seq_len, opts.recompute, opts.formula is Formula.MEGATRON)
    if opts.formula is Formula.MEGATRON and not shape.gpt_like:
        notes.append("Megatron's Equation 3 assumes a 4h MLP and as many key/value heads as query heads; "
                     "this model differs, so --formula params counts it more closely")
    if shape.layers is None and opts.seq_len:
        notes.append("attention FLOPs (12*L*h*s per token) left out: --hf-config gives the depth and width")
    per_gpu = iteration_s * gpus * 1e12
    model_tflops, hw_tflops = flops.model / per_gpu, flops.hardware / per_gpu
    gpu = opts.gpu or detected_gpu()
    peak = peak_tflops(gpu, str(opts.dtype)) if gpu else None
    if gpu and peak is None:
        notes.append(f"no peak is known for {gpu!r}: name one the table knows (--gpu-model H100, A100, ...)")
    mfu = model_tflops / peak if peak else None
    hfu = hw_tflops / peak if peak else None
    if not all(math.isfinite(x) for x in (model_tflops, hw_tflops)):
        raise UsageError("the numbers given do not make a finite throughput", "check --iter-time and the sizes")
    utilisation = max((u for u in (mfu, hfu) if u is not None), default=None)
    if utilisation is not None and utilisation > 1:
        # no GPU runs above its peak: the inputs are in the wrong units (ms for s, a batch in tokens...)
        which = "HFU" if hfu is not None and utilisation == hfu and opts.recompute else "MFU"
        raise UsageError(f"{which} {utilisation:.0%} of {gpu}'s {peak:g} {opts.dtype} TFLOP/s peak is impossible "
                         "(more than 100%): a units mistake",
                         "--iter-time is in seconds per iteration, --params in parameters (7B), --global-batch in "
                         "sequences (not tokens), --gpus all GPUs of the job")
    summary = f"{model_tflops:.1f} model TFLOP/s per GPU" + (f", MFU {mfu:.1%}" if mfu is not None else "")
    if opts.recompute:
        summary += f"; {hw_tflops:.1f} hardware TFLOP/s" + (f", HFU {hfu:.1%}" if hfu is not None else "")
    if gpu and peak:
        summary += f" of {gpu}'s {peak:g} {opts.dtype} peak"
    arithmetic = [f"model: {flops.model:.4g} FLOPs / ({iteration_s:.4g} s x {gpus} GPUs) = {model_tflops:.1f} TFLOP/s"]
    if opts.recompute:
        arithmetic.append(f"hardware: {flops.hardware:.4g} FLOPs / ({iteration_s:.4g} s x {gpus} GPUs) = "
                          f"{hw_tflops:.1f} TFLOP/s")
    if mfu is not None:
        arithmetic.append(f"MFU: {model_tflops:.1f} / {peak:g} = {mfu:.1%}")
    return TflopsReport(
        ok=True, summary=summary, formula=flops.formula, arithmetic=arithmetic, params=shape.params, params_source=shape.source,
        layers=shape.layers, hidden=shape.hidden, vocab=shape.vocab, seq_len=opts.seq_len,
        tokens_per_iteration=tokens, iteration_s=iteration_s, iteration_source=where, gpus=gpus,
        recompute=opts.recompute, model_tflops=model_tflops, hardware_tflops=hw_tflops, gpu=gpu,
        peak_kind=str(opts.dtype), peak_tflops=peak, mfu=mfu, hfu=hfu,
        tokens_per_s_per_gpu=tokens / iteration_s / gpus, notes=notes)
