"""Configuration of the bundled training job: plain dataclasses, one docstring per field.

Torch-free, so the CLI can validate options before importing torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from ml_debug.core.errors import UsageError

NUMERICS = ("fp32", "bf16", "fp8", "mx")
MX_FORMATS = ("fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp6_e3m2", "fp4_e2m1", "int8")
MX_SCALE_MODES = ("floor", "rceil")
AC_MODES = ("none", "full", "selective")
OPTIMIZER_IMPLS = ("auto", "fused", "foreach", "for-loop")
SCHEDULES = ("cosine", "linear", "constant")
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
    if step < 1 or rank < 0 or factor < 1 or where not in ("loss", "grad"):
        raise UsageError(f"--inject {text!r}: need step >= 1, rank >= 0, factor >= 1, where loss|grad", hint)
    return FaultSpec(kind, step, rank, factor, code, where)


@dataclass
class TrainConfig:
    """Everything one training run needs; the CLI fills it from options."""

    preset: str = "tiny"
    """Model size: tiny, debug, 125m or 1b."""
    steps: int = 50
    """Optimizer steps to run (the run stops at this step, resume included)."""
    batch_size: int = 4
    """Sequences per rank per micro-batch."""
    seq_len: int = 64
    """Tokens per sequence (batch_size * seq_len must be a multiple of 32 for MX)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (gradient accumulation)."""
    lr: float = 3e-3
    """Peak learning rate."""
    min_lr_ratio: float = 0.1
    """The schedule decays to lr * min_lr_ratio."""
    warmup_steps: int = 5
    """Linear warmup from 0 to lr over this many steps."""
    schedule: str = "cosine"
    """Decay after warmup: cosine, linear or constant."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay (not applied to norms)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    grad_clip: float = 1.0
    """Clip the global grad norm (over all shards) to this; 0 disables clipping."""
    optimizer_impl: str = "auto"
    """AdamW implementation: fused, foreach, for-loop or auto (fused on GPU, foreach on CPU)."""
    zero_grad_set_to_none: bool = True
    """zero_grad(set_to_none=...): free the grads between steps (True) or zero them in place."""
    numerics: str = "fp32"
    """fp32, bf16 (FSDP mixed precision, fp32 reduce), fp8 (torchao float8) or mx."""
    mx_format: str = "fp8_e4m3"
    """MX element format: fp8_e4m3, fp8_e5m2, fp6_e2m3, fp6_e3m2, fp4_e2m1 or int8."""
    mx_scale_mode: str = "floor"
    """MX scale: floor (OCP spec) or rceil (cuBLAS/Blackwell)."""
    activation_checkpoint: str = "none"
    """Recompute activations in backward: none, full (every block) or selective (every ac_every-th)."""
    ac_every: int = 2
    """selective activation checkpointing: checkpoint one block in this many."""
    cpu_offload: bool = False
    """FSDP2 CPUOffloadPolicy: keep sharded params/grads/optimizer state in host memory."""
    reshard_after_forward: bool = True
    """FSDP2: free gathered params after forward (ZeRO-3) or keep them until backward (ZeRO-2)."""
    fsdp: bool = True
    """Shard with FSDP2; False trains a plain (replicated, unsynchronised) model: benchmarks only."""
    seed: int = 1234
    """Seed of the initial weights (the data stream is deterministic by itself)."""
    data: str = "synthetic"
    """Text source: synthetic (generated arithmetic, the same everywhere), stdlib (Python's own .py
    files) or a path to a text file."""
    device: str = "auto"
    """auto, cpu, cuda or cuda:N."""
    backend: str = "auto"
    """auto, gloo or nccl."""
    timeout: float = 120.0
    """Seconds a collective may wait before the process group gives up."""
    log_every: int = 1
    """One human line on rank 0 every this many steps."""
    stats_every: int = 10
    """Record MX/fp8 saturation/underflow/amax per layer every this many steps (0: never)."""
    metrics_dir: Path | None = None
    """Write one JSON line per step per rank to METRICS_DIR/rank-R.jsonl."""
    checkpoint_dir: Path | None = None
    """Folder of step-N checkpoints (torch.distributed.checkpoint)."""
    checkpoint_every: int = 0
    """Save every this many steps (0: only on the save switch and at the end when a dir is given)."""
    keep_last: int = 2
    """Keep the newest K complete checkpoints."""
    resume: bool = True
    """Continue from the newest complete checkpoint in checkpoint_dir when there is one."""
    kill_switch: Path | None = None
    """When this file exists (checked at start and every step) the job saves nothing and exits 0."""
    save_switch: Path | None = None
    """When this file exists the job saves a checkpoint now, then deletes the file."""
    init_from: Path | None = None
    """A full (unsharded) state dict saved with torch.save: rank 0 loads it, then broadcasts."""
    profile_steps: tuple[int, int] | None = None
    """Profile steps A..B (inclusive) with torch.profiler; one trace per rank."""
    profile_dir: Path | None = None
    """Where profiler traces go (default: metrics_dir, else ./profile)."""
    inject: list[FaultSpec] = field(default_factory=list)
    """Faults to inject (see FaultSpec)."""
    core_dir: Path | None = None
    """segfault: each rank runs from CORE_DIR/rank-R so its core file lands there."""

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
