"""Configuration of the bundled training job: plain dataclasses; TrainConfig's fields are the CLI options.

Torch-free, so the CLI can validate options before importing torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from ml_debug.core.enums import Word
from ml_debug.core.errors import UsageError
from ml_debug.core.options import input_file, option, output_dir
from ml_debug.dist.options import backend_option, device_option

# The choices of train's options, as Word enums: a misspelt one is refused when the command line is read
# (exit 2), before any rank starts. A member is its value: it compares, hashes and prints as the word.


class Numerics(Word):
    FP32 = "fp32"
    BF16 = "bf16"
    FP8 = "fp8"
    MX = "mx"


class MxFormat(Word):
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"
    FP6_E2M3 = "fp6_e2m3"
    FP6_E3M2 = "fp6_e3m2"
    FP4_E2M1 = "fp4_e2m1"
    INT8 = "int8"


class MxScale(Word):
    FLOOR = "floor"
    RCEIL = "rceil"


class ActivationCheckpoint(Word):
    NONE = "none"
    FULL = "full"
    SELECTIVE = "selective"


class OptimizerImpl(Word):
    AUTO = "auto"
    FUSED = "fused"
    FOREACH = "foreach"
    FOR_LOOP = "for-loop"


class Schedule(Word):
    COSINE = "cosine"
    LINEAR = "linear"
    CONSTANT = "constant"


NUMERICS = tuple(m.value for m in Numerics)
MX_FORMATS = tuple(m.value for m in MxFormat)
MX_SCALE_MODES = tuple(m.value for m in MxScale)
AC_MODES = tuple(m.value for m in ActivationCheckpoint)
OPTIMIZER_IMPLS = tuple(m.value for m in OptimizerImpl)
SCHEDULES = tuple(m.value for m in Schedule)
FAULT_KINDS = ("hang", "straggler", "crash", "segfault", "nan", "desync", "exit")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the Llama-style decoder."""

    name: str
    """Preset name (tiny, debug, 125m, 1b)."""
    dim: int
    """Width of the residual stream."""
    n_layers: int
    """Number of transformer blocks."""
    n_heads: int
    """Attention heads (head_dim = dim / n_heads)."""
    n_kv_heads: int
    """Key/value heads (grouped-query attention when fewer than n_heads)."""
    ffn_dim: int
    """Hidden width of the SwiGLU feed-forward (a multiple of 32, so MX blocks fit)."""
    vocab_size: int = 256
    """Byte-level tokenizer: 256 symbols."""
    max_seq_len: int = 2048
    """Longest sequence RoPE tables are built for."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""


PRESETS: dict[str, ModelConfig] = {
    # CI: a step in a few tens of ms on 2 CPU ranks.
    "tiny": ModelConfig("tiny", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=256),
    # torchtitan's debug model, with a byte vocabulary.
    "debug": ModelConfig("debug", dim=256, n_layers=6, n_heads=16, n_kv_heads=16, ffn_dim=768,
                         max_seq_len=2048),
    # GPU sizes: ~124M and ~0.97B non-embedding parameters.
    "125m": ModelConfig("125m", dim=768, n_layers=14, n_heads=12, n_kv_heads=12, ffn_dim=2816,
                        max_seq_len=2048),
    "1b": ModelConfig("1b", dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192,
                      max_seq_len=4096, rope_theta=500000.0),
}


@dataclass(frozen=True)
class FaultSpec:
    """One injected fault: ``KIND@step=S,rank=R[,key=value...]``."""

    kind: str
    """hang, straggler, crash, segfault, nan, desync or exit."""
    step: int
    """Training step (1-based) at which the fault fires."""
    rank: int
    """Global rank that misbehaves."""
    factor: float = 5.0
    """straggler: the rank's step takes this many times longer (from this step on)."""
    code: int = 0
    """exit: the exit status of the silent exit."""
    where: str = "loss"
    """nan: poison the 'loss' or a 'grad'."""

    def describe(self) -> str:
        return f"{self.kind}@step={self.step},rank={self.rank}"


def parse_fault(text: str) -> FaultSpec:
    """Parse ``KIND@step=S,rank=R[,factor=F][,code=C][,where=loss|grad]``."""
    hint = ("use KIND@step=S,rank=R, e.g. hang@step=3,rank=1; kinds: " + ", ".join(FAULT_KINDS))
    kind, sep, rest = text.strip().partition("@")
    kind = kind.strip().lower()
    if kind not in FAULT_KINDS:
        raise UsageError(f"unknown fault {kind!r} in --inject {text!r}", hint)
    values: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))) if sep else ():
        key, eq, value = part.partition("=")
        if not eq:
            raise UsageError(f"--inject {text!r}: {part!r} is not key=value", hint)
        values[key.strip().lower()] = value.strip()
    try:
        step = int(values.pop("step", "1"))
        rank = int(values.pop("rank", "0"))
        factor = float(values.pop("factor", "5"))
        code = int(values.pop("code", "0"))
    except ValueError as e:
        raise UsageError(f"--inject {text!r}: {e}", hint) from e
    where = values.pop("where", "loss")
    if values:
        raise UsageError(f"--inject {text!r}: unknown key(s) {', '.join(sorted(values))}",
                         "keys: step, rank, factor (straggler), code (exit), where (nan: loss|grad)")
    if not 0 <= code <= 255:  # a process's exit status is one byte: 999 would exit 231
        raise UsageError(f"--inject {text!r}: code={code} is not an exit code", "use code=N with 0 <= N <= 255")
    if step < 1 or rank < 0 or not 1 <= factor < math.inf or where not in ("loss", "grad"):
        raise UsageError(f"--inject {text!r}: need step >= 1, rank >= 0, a finite factor >= 1, where loss|grad",
                         hint)
    return FaultSpec(kind, step, rank, factor, code, where)


def format_fault(f: FaultSpec) -> str:
    """The ``--inject`` word that :func:`parse_fault` reads back as ``f``."""
    return f"{f.kind}@step={f.step},rank={f.rank},factor={f.factor!r},code={f.code},where={f.where}"


def parse_betas(text: str) -> tuple[float, float]:
    """``B1,B2`` -> (B1, B2), each in [0, 1)."""
    try:
        b1, b2 = (float(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"bad --betas {text!r}", "use two numbers in [0, 1), e.g. --betas 0.9,0.95") from None
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise UsageError(f"bad --betas {text!r}: each must be in [0, 1)", "e.g. --betas 0.9,0.95")
    return b1, b2


def parse_profile_steps(text: str | None) -> tuple[int, int] | None:
    """``A:B`` (or a single step ``A``) -> (A, B)."""
    if not text:
        return None
    a, _, b = text.partition(":")
    try:
        start, end = int(a), int(b or a)
    except ValueError as e:
        raise UsageError(f"bad --profile-steps {text!r}", "use A:B, e.g. --profile-steps 3:5") from e
    return start, end


MODEL, OPTIM, RUN, STATE, FAULTS = "Model", "Optimizer", "Run", "Checkpoints and switches", "Faults"


@dataclass
class TrainConfig:
    """Everything one training run needs: the options of `mldebug train`, one field each."""

    preset: str = option("tiny", panel=MODEL, help="Model size: tiny (CI), debug, 125m, 1b.")
    steps: int = option(50, min=1, panel=RUN, help="Optimizer steps (the run stops at this step, resume included).")
    batch_size: int = option(4, min=1, panel=RUN, help="Sequences per rank per micro-batch.")
    seq_len: int = option(64, min=2, panel=RUN,
                          help="Tokens per sequence (batch_size * seq_len must be a multiple of 32 for MX).")
    grad_accum: int = option(1, min=1, panel=RUN, help="Micro-batches per optimizer step (gradient accumulation).")
    lr: float = option(3e-3, min=0.0, panel=OPTIM, help="Peak learning rate.")
    min_lr_ratio: float = option(0.1, min=0.0, max=1.0, panel=OPTIM,
                                 help="The schedule decays to lr * min_lr_ratio.")
    warmup_steps: int = option(5, min=0, panel=OPTIM, help="Linear warmup from 0 to lr over this many steps.")
    schedule: Schedule = option(Schedule.COSINE, panel=OPTIM, help="Decay after warmup: cosine, linear, constant.")
    weight_decay: float = option(0.1, min=0.0, panel=OPTIM, help="AdamW decoupled weight decay (not on norms).")
    betas: tuple[float, float] = option((0.9, 0.95), metavar="B1,B2", panel=OPTIM, parse=parse_betas,
                                        format=lambda b: f"{b[0]!r},{b[1]!r}", help="AdamW betas.")
    grad_clip: float = option(1.0, min=0.0, panel=OPTIM,
                              help="Clip the global grad norm (over all shards) to this; 0 disables clipping.")
    optimizer_impl: OptimizerImpl = option(OptimizerImpl.AUTO, panel=OPTIM,
                                 help="AdamW implementation: auto (fused on GPU, foreach on CPU), fused, foreach, "
                                      "for-loop.")
    zero_grad_set_to_none: bool = option(True, flags=("--zero-grad-to-none/--zero-grad-in-place",), panel=OPTIM,
                                         help="Free the grads between steps, or zero them in place.")
    numerics: Numerics = option(Numerics.FP32, panel=MODEL,
                           help="fp32, bf16 (FSDP mixed precision, fp32 reduce), fp8 (torchao float8) or mx.")
    mx_format: MxFormat = option(MxFormat.FP8_E4M3, panel=MODEL,
                            help="MX elements: fp8_e4m3, fp8_e5m2, fp6_e2m3, fp6_e3m2, fp4_e2m1, int8.")
    mx_scale_mode: MxScale = option(MxScale.FLOOR, flags=("--mx-scale",), panel=MODEL,
                                help="MX scale rule: floor (OCP spec) or rceil (cuBLAS/Blackwell).")
    activation_checkpoint: ActivationCheckpoint = option(ActivationCheckpoint.NONE, flags=("--ac",), panel=MODEL,
                                        help="Recompute activations in backward: none, full (every block) or "
                                             "selective (every --ac-every-th block).")
    ac_every: int = option(2, min=1, panel=MODEL, help="selective: checkpoint one block in N.")
    compile_blocks: bool = option(False, flags=("--compile/--no-compile",), panel=MODEL,
                                  help="torch.compile each transformer block (torchtitan's way). fp8 needs it: "
                                       "eager torchao float8 is slower than bf16. The first steps pay the "
                                       "compile time (not counted in the median step time).")
    cpu_offload: bool = option(False, flags=("--cpu-offload/--no-cpu-offload",), panel=MODEL,
                               help="FSDP2 CPU offload of params/grads/optimizer state.")
    reshard_after_forward: bool = option(True, flags=("--reshard-after-forward/--no-reshard-after-forward",),
                                         panel=MODEL, help="FSDP2 ZeRO-3 (on) or ZeRO-2 (off).")
    fsdp: bool = option(True, flags=("--fsdp/--no-fsdp",), panel=MODEL,
                        help="Shard with FSDP2 (off: plain unsynchronised copies; benchmarks only).")
    seed: int = option(1234, metavar="N", panel=RUN, help="Seed of the initial weights (the data stream is deterministic).")
    data: str = option("synthetic", panel=RUN,
                       help="synthetic (generated arithmetic), stdlib (Python's own .py files) or a text file.")
    device: str = device_option()
    backend: str = backend_option()
    timeout: float = option(120.0, flags=("--collective-timeout",), renamed_from=("--timeout",), min=1.0, metavar="S",
                            panel=RUN, help="Seconds before init or any one collective gives up.")
    log_every: int = option(1, min=1, panel=RUN, help="Human log line every N steps (rank 0).")
    stats_every: int = option(10, min=0, panel=RUN,
                              help="Numerics stats (MX/fp8 saturation, underflow, amax) per layer every N steps "
                                   "(0: never).")
    metrics_dir: Path | None = option(None, file_okay=False, panel=RUN,
                                      help="One JSON line per step per rank: DIR/rank-R.jsonl.")
    checkpoint_dir: Path | None = option(None, file_okay=False, panel=STATE,
                                         help="step-N checkpoints here (torch.distributed.checkpoint).")
    checkpoint_every: int = option(0, min=0, panel=STATE, help="Save every N steps (0: at the end).")
    keep_last: int = option(2, min=1, panel=STATE, help="Keep the newest K complete checkpoints.")
    resume: bool = option(True, flags=("--resume/--no-resume",), panel=STATE,
                          help="Continue from the newest complete checkpoint.")
    kill_switch: Path | None = option(None, panel=STATE,
                                      help="Stop cleanly (exit 0, no save) when this file exists.")
    save_switch: Path | None = option(None, panel=STATE, help="Save when this file exists, then delete it.")
    init_from: Path | None = option(None, dir_okay=False, panel=STATE,
                                    help="Full state dict (torch.save) loaded by rank 0 and broadcast.")
    profile_steps: tuple[int, int] | None = option(
        None, metavar="A:B", panel=RUN, parse=parse_profile_steps, format=lambda p: f"{p[0]}:{p[1]}",
        help="Profile steps A..B with torch.profiler (a trace per rank).")
    profile_dir: Path | None = option(None, file_okay=False, panel=RUN,
                                      help="Where traces go (default METRICS_DIR/profile, else ./profile).")
    inject: list[FaultSpec] = option(default_factory=list, metavar="KIND@step=S,rank=R", panel=FAULTS,
                                     parse=parse_fault, format=format_fault,
                                     help="Inject a fault (repeatable): hang, straggler, crash, segfault, nan, "
                                          "desync, exit; keys step, rank, factor, code, where.")
    core_dir: Path | None = option(None, file_okay=False, panel=FAULTS,
                                   help="segfault: each rank runs in CORE_DIR/rank-R so its core lands there "
                                        "(default ./cores).")

    @property
    def model(self) -> ModelConfig:
        return dataclasses.replace(PRESETS[self.preset], max_seq_len=max(PRESETS[self.preset].max_seq_len,
                                                                          self.seq_len))

    def validate(self, world_size: int = 1) -> None:
        """Raise UsageError (exit 2) for impossible combinations, before any work starts."""
        def bad(msg: str, hint: str) -> None:
            raise UsageError(msg, hint)

        if self.preset not in PRESETS:
            bad(f"unknown preset {self.preset!r}", "use --preset " + ", ".join(PRESETS))
        if self.numerics not in NUMERICS:
            bad(f"unknown numerics {self.numerics!r}", "use --numerics " + ", ".join(NUMERICS))
        if self.mx_format not in MX_FORMATS:
            bad(f"unknown MX format {self.mx_format!r}", "use --mx-format " + ", ".join(MX_FORMATS))
        if self.mx_scale_mode not in MX_SCALE_MODES:
            bad(f"unknown MX scale mode {self.mx_scale_mode!r}", "use --mx-scale floor or rceil")
        if self.activation_checkpoint not in AC_MODES:
            bad(f"unknown activation checkpointing {self.activation_checkpoint!r}",
                "use --ac none, full or selective")
        if self.optimizer_impl not in OPTIMIZER_IMPLS:
            bad(f"unknown optimizer implementation {self.optimizer_impl!r}",
                "use --optimizer-impl " + ", ".join(OPTIMIZER_IMPLS))
        if self.schedule not in SCHEDULES:
            bad(f"unknown schedule {self.schedule!r}", "use --schedule " + ", ".join(SCHEDULES))
        for name in ("steps", "batch_size", "seq_len", "grad_accum", "log_every", "keep_last", "ac_every"):
            if getattr(self, name) < 1:
                bad(f"--{name.replace('_', '-')} must be at least 1", "pass a positive integer")
        if self.numerics == "mx" and (self.batch_size * self.seq_len) % 32:
            bad(f"MX needs tokens per micro-batch (batch {self.batch_size} x seq {self.seq_len}) to be a "
                "multiple of 32: the weight-gradient GEMM quantises along the token axis",
                "pick --batch-size/--seq-len whose product is a multiple of 32")
        if self.profile_steps and not (1 <= self.profile_steps[0] <= self.profile_steps[1]):
            bad(f"bad --profile-steps {self.profile_steps}", "use A:B with 1 <= A <= B, e.g. 3:5")
        for fault in self.inject:
            if fault.rank >= world_size:
                bad(f"--inject {fault.describe()}: rank {fault.rank} does not exist in a world of {world_size}",
                    f"use a rank below {world_size}")
        # Paths last, as the directories are made here: a run must not train for hours and then fail to save.
        if self.init_from is not None:
            input_file("--init-from", self.init_from)
        from ml_debug.core import safefs

        for flag, path in (("--checkpoint-dir", self.checkpoint_dir), ("--metrics-dir", self.metrics_dir),
                           ("--profile-dir", self.profile_dir if self.profile_steps else None),
                           ("--core-dir", self.core_dir)):
            if path is not None:
                # made by safefs's rules first: no link of another user followed, the directory ours or root's
                safefs.make_out_dir(path, flag)
                output_dir(flag, path)
