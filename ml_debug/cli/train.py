"""`mldebug train`: the bundled FSDP2 low-bit training job (and its fault injection)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ml_debug.cli.launch_options import (
    Backend,
    Device,
    MasterAddr,
    MasterPort,
    Nnodes,
    NodeRank,
    NprocPerNode,
)
from ml_debug.cli.options import Json

HELP = """Train a small Llama-style model with FSDP2, on CPU (gloo) or GPUs (NCCL), and break it on purpose.

Examples:
  mldebug train --nproc-per-node 2 --preset tiny --steps 50
  torchrun --nproc-per-node 8 -m ml_debug.train --preset 1b --numerics fp8 --steps 100
  mldebug train --nproc-per-node 2 --inject hang@step=3,rank=1 --timeout 60
  mldebug train --nproc-per-node 2 --checkpoint-dir ckpt --checkpoint-every 10 --metrics-dir m

Faults (--inject KIND@step=S,rank=R[,factor=F][,code=C][,where=loss|grad], repeatable):
hang, straggler, crash, segfault, nan, desync, exit. See docs/commands/train.md for which mldebug
command diagnoses each one.

Exit codes: 0 trained (or stopped by the kill switch); 1 a rank failed (non-finite loss named by
rank, a collective failed, an injected crash); 2 bad options; 4 some ranks never finished."""


def register(app: typer.Typer) -> None:
    @app.command("train", help=HELP, no_args_is_help=False)
    def train_command(
        preset: Annotated[str, typer.Option(help="Model size: tiny (CI), debug, 125m, 1b.")] = "tiny",
        steps: Annotated[int, typer.Option(min=1, help="Optimizer steps (resume continues up to this step).")] = 50,
        batch_size: Annotated[int, typer.Option(min=1, help="Sequences per rank per micro-batch.")] = 4,
        seq_len: Annotated[int, typer.Option(min=2, help="Tokens per sequence.")] = 64,
        grad_accum: Annotated[int, typer.Option(min=1, help="Micro-batches per optimizer step.")] = 1,
        lr: Annotated[float, typer.Option(min=0.0, help="Peak learning rate.")] = 3e-3,
        warmup_steps: Annotated[int, typer.Option(min=0, help="Linear warmup steps.")] = 5,
        schedule: Annotated[str, typer.Option(help="Decay after warmup: cosine, linear, constant.")] = "cosine",
        weight_decay: Annotated[float, typer.Option(min=0.0, help="AdamW weight decay.")] = 0.1,
        grad_clip: Annotated[float, typer.Option(min=0.0, help="Clip the global grad norm (0: off).")] = 1.0,
        optimizer_impl: Annotated[str, typer.Option(help="AdamW: auto, fused, foreach, for-loop.")] = "auto",
        zero_grad_to_none: Annotated[bool, typer.Option("--zero-grad-to-none/--zero-grad-in-place",
                                                        help="Free grads between steps, or zero them.")] = True,
        numerics: Annotated[str, typer.Option(help="fp32, bf16, fp8 (torchao float8), mx.")] = "fp32",
        mx_format: Annotated[str, typer.Option(help="MX elements: fp8_e4m3, fp8_e5m2, fp6_e2m3, fp6_e3m2, "
                                                    "fp4_e2m1, int8.")] = "fp8_e4m3",
        mx_scale: Annotated[str, typer.Option(help="MX scale rule: floor (OCP spec) or rceil (cuBLAS).")] = "floor",
        ac: Annotated[str, typer.Option("--ac", help="Activation checkpointing: none, full, selective.")] = "none",
        ac_every: Annotated[int, typer.Option(min=1, help="selective: checkpoint one block in N.")] = 2,
        cpu_offload: Annotated[bool, typer.Option(help="FSDP2 CPU offload of params/grads/optimizer.")] = False,
        reshard_after_forward: Annotated[bool, typer.Option(help="FSDP2 ZeRO-3 (on) or ZeRO-2 (off).")] = True,
        fsdp: Annotated[bool, typer.Option(help="Shard with FSDP2 (off: plain unsynchronised copies; "
                                                "benchmarks only).")] = True,
        seed: Annotated[int, typer.Option(help="Seed of the initial weights.")] = 1234,
        data: Annotated[str, typer.Option(help="synthetic, stdlib, or a text file.")] = "synthetic",
        log_every: Annotated[int, typer.Option(min=1, help="Human log line every N steps (rank 0).")] = 1,
        stats_every: Annotated[int, typer.Option(min=0, help="Numerics stats per layer every N steps.")] = 10,
        metrics_dir: Annotated[Path | None, typer.Option(help="One JSON line per step per rank: DIR/rank-R.jsonl.",
                                                         file_okay=False)] = None,
        checkpoint_dir: Annotated[Path | None, typer.Option(help="step-N DCP checkpoints here.",
                                                            file_okay=False)] = None,
        checkpoint_every: Annotated[int, typer.Option(min=0, help="Save every N steps (0: at the end).")] = 0,
        keep_last: Annotated[int, typer.Option(min=1, help="Keep the newest K complete checkpoints.")] = 2,
        resume: Annotated[bool, typer.Option(help="Continue from the newest complete checkpoint.")] = True,
        kill_switch: Annotated[Path | None, typer.Option(help="Stop cleanly when this file exists.")] = None,
        save_switch: Annotated[Path | None, typer.Option(help="Save when this file exists, then delete it.")] = None,
        init_from: Annotated[Path | None, typer.Option(help="Full state dict (torch.save) loaded by rank 0 and "
                                                            "broadcast.", dir_okay=False)] = None,
        profile_steps: Annotated[str | None, typer.Option(help="Profile steps A:B (torch.profiler, a trace "
                                                               "per rank).")] = None,
        profile_dir: Annotated[Path | None, typer.Option(help="Where traces go (default METRICS_DIR/profile).",
                                                         file_okay=False)] = None,
        inject: Annotated[list[str] | None, typer.Option(help="KIND@step=S,rank=R[,...] (repeatable).")] = None,
        core_dir: Annotated[Path | None, typer.Option(help="segfault: each rank runs in CORE_DIR/rank-R so its "
                                                           "core lands there (default ./cores).",
                                                      file_okay=False)] = None,
        timeout: Annotated[float, typer.Option(min=1.0, help="Seconds a collective may wait.")] = 120.0,
        nproc_per_node: NprocPerNode = None,
        nnodes: Nnodes = 1,
        node_rank: NodeRank = 0,
        master_addr: MasterAddr = None,
        master_port: MasterPort = None,
        backend: Backend = "auto",
        device: Device = "auto",
        json: Json = False,
    ) -> None:
        from ml_debug.cli.options import use_json
        from ml_debug.train.config import TrainConfig, parse_fault, parse_profile_steps

        as_json = use_json(json)
        cfg = TrainConfig(
            preset=preset, steps=steps, batch_size=batch_size, seq_len=seq_len, grad_accum=grad_accum, lr=lr,
            warmup_steps=warmup_steps, schedule=schedule, weight_decay=weight_decay, grad_clip=grad_clip,
            optimizer_impl=optimizer_impl, zero_grad_set_to_none=zero_grad_to_none, numerics=numerics,
            mx_format=mx_format, mx_scale_mode=mx_scale, activation_checkpoint=ac, ac_every=ac_every,
            cpu_offload=cpu_offload, reshard_after_forward=reshard_after_forward, fsdp=fsdp, seed=seed, data=data,
            device=device, backend=backend, timeout=timeout, log_every=log_every, stats_every=stats_every,
            metrics_dir=metrics_dir, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
            keep_last=keep_last, resume=resume, kill_switch=kill_switch, save_switch=save_switch,
            init_from=init_from, profile_steps=parse_profile_steps(profile_steps), profile_dir=profile_dir,
            inject=[parse_fault(t) for t in inject or []], core_dir=core_dir)
        # Every option is checked before any rank starts (ranks are checked again, knowing the world).
        from ml_debug.dist import is_launched

        launching = nproc_per_node is not None and not is_launched()
        cfg.validate(world_size=(nproc_per_node or 1) * nnodes if launching else 1 << 30)
        if launching:
            code = _self_launch(cfg, as_json, nproc_per_node or 1, nnodes, node_rank, master_addr, master_port)
        else:
            code = _run_rank(cfg, as_json)
        if code:
            raise typer.Exit(code)


def worker_argv(cfg: object, as_json: bool) -> list[str]:
    """The `mldebug train ...` words that rebuild ``cfg`` in a launched rank."""
    import dataclasses

    from ml_debug.train.config import TrainConfig

    assert isinstance(cfg, TrainConfig)
    argv = ["train"]
    flags = {"activation_checkpoint": "--ac", "mx_scale_mode": "--mx-scale",
             "zero_grad_set_to_none": "--zero-grad-to-none/--zero-grad-in-place"}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        name = flags.get(f.name, "--" + f.name.replace("_", "-"))
        if f.name in ("betas", "min_lr_ratio"):
            continue
        if value is None:
            continue
        if isinstance(value, bool):
            on, _, off = name.partition("/")
            argv.append(on if value else (off or "--no-" + on[2:]))
        elif f.name == "inject":
            for fault in value:
                argv += ["--inject", f"{fault.kind}@step={fault.step},rank={fault.rank},factor={fault.factor},"
                                     f"code={fault.code},where={fault.where}"]
        elif f.name == "profile_steps":
            argv += [name, f"{value[0]}:{value[1]}"]
        elif isinstance(value, Path):
            argv += [name, str(value.resolve())]
        else:
            argv += [name, str(value)]
    if as_json:
        argv.append("--json")
    return argv


def _self_launch(cfg: object, as_json: bool, nproc: int, nnodes: int, node_rank: int, master_addr: str | None,
                 master_port: int | None) -> int:
    from ml_debug.core import output
    from ml_debug.core.errors import ExitCode
    from ml_debug.dist import LaunchSpec, launch

    result = launch(worker_argv(cfg, as_json), LaunchSpec(nproc_per_node=nproc, nnodes=nnodes,
                                                          node_rank=node_rank, master_addr=master_addr,
                                                          master_port=master_port))
    code = result.code
    if code == ExitCode.PARTIAL:
        missing = sorted(r for r, c in result.exit_codes.items() if c < 0)
        output.warn("some ranks did not finish" + (f" (killed or crashed: {missing})" if missing else ""))
    elif code == ExitCode.OK and any(c != 0 for c in result.exit_codes.values()):
        bad = {r: c for r, c in result.exit_codes.items() if c != 0}
        output.warn(f"rank 0 finished but other ranks failed: {bad}")
        code = ExitCode.PROBLEM
    return int(code)


def _run_rank(cfg: object, as_json: bool) -> int:
    """This process's part: train, then rank 0 reports."""
    from torch.distributed.elastic.multiprocessing.errors import record

    from ml_debug.core import output
    from ml_debug.core.errors import ProblemFound
    from ml_debug.train.faults import InjectedCrash
    from ml_debug.train.loop import SCHEMA, train

    try:
        # record() writes the torchelastic error file (TORCHELASTIC_ERROR_FILE) with the traceback,
        # so `torchrun` names the failing rank and its exception in its summary.
        result = record(train)(cfg)
    except InjectedCrash as e:
        raise ProblemFound(str(e), "this was --inject crash; torchrun's summary and the torchelastic error "
                                   "file carry the traceback") from e
    import os

    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    output.emit(SCHEMA, 1, result, lambda console: _render(result, console), as_json=as_json)
    return 0 if result.ok else 1


def _render(result: object, console: object) -> None:
    from rich.table import Table

    from ml_debug.train.loop import TrainResult

    assert isinstance(result, TrainResult)
    table = Table(title=f"mldebug train: {result.summary}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")

    def fmt(x: float | None, spec: str) -> str:
        return "n/a" if x is None else format(x, spec)

    rows = [
        ("model", f"{result.preset} ({result.n_params / 1e6:.2f}M non-embedding params)"),
        ("world", f"{result.world_size} rank(s) on {result.device}"),
        ("numerics", result.numerics),
        ("steps", f"{result.start_step + 1}..{result.last_step} ({result.steps_run} run, {result.stopped_by})"),
        ("final loss", fmt(result.final_loss, ".4f")),
        ("tokens/s per device", fmt(result.tokens_per_s, ",.0f")),
        ("TFLOP/s per device", fmt(result.tflops, ".3g")),
        ("MFU", "n/a (no known peak for this device)" if result.mfu is None else f"{result.mfu * 100:.1f}%"),
        ("step time", "n/a" if result.step_time_s is None else f"{result.step_time_s * 1e3:.1f} ms"),
    ]
    if result.checkpoints:
        rows.append(("checkpoints", ", ".join(result.checkpoints[-2:])))
    if result.profile_trace:
        rows.append(("profile trace", result.profile_trace))
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)  # type: ignore[attr-defined]
