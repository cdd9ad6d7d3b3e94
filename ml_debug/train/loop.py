"""The training loop: one function, :func:`train`, that every rank runs.

Per step: faults due now, micro-batches (forward, loss, backward; gradient sync only on the last
one), ONE small all_reduce carrying each rank's non-finite flags, the grad-norm partial sums, the
loss and the switch files, then clipping, the optimizer step, metrics and checkpoints. Putting all
the per-step agreement into one collective keeps the CPU/gloo step fast and makes every rank take
the same decision (stop, save, fail) at the same step.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ml_debug.core.errors import MLDebugError, ProblemFound
from ml_debug.train.config import TrainConfig

SCHEMA = "mldebug.train"


class NonFiniteError(ProblemFound):
    """A rank produced a NaN/Inf loss or gradient (raised on every rank, before the optimizer step)."""


class CollectiveFailure(ProblemFound):
    """A collective failed or timed out: a peer is hung, slow or gone."""


@dataclass
class TrainResult:
    """What one run did (rank 0's view; the per-rank detail is in METRICS_DIR)."""

    ok: bool
    summary: str
    preset: str
    numerics: str
    world_size: int
    device: str
    n_params: int
    start_step: int  # the step resumed from (0: a fresh start)
    last_step: int
    steps_run: int
    stopped_by: str  # completed, kill-switch
    losses: dict[int, float] = field(default_factory=dict)  # step -> loss (mean over ranks)
    final_loss: float | None = None
    tokens_per_s: float | None = None  # median per device, steps after the first
    tflops: float | None = None
    mfu: float | None = None
    step_time_s: float | None = None
    checkpoints: list[str] = field(default_factory=list)
    numerics_stats: dict[str, Any] | None = None
    profile_trace: str | None = None
    elapsed_s: float = 0.0


def _abs(p: Path | None) -> Path | None:
    return p.resolve() if p is not None else None


def _resolve_paths(cfg: TrainConfig) -> None:
    # A segfault injection chdirs to a per-rank core folder: make every user path absolute first.
    for name in ("metrics_dir", "checkpoint_dir", "kill_switch", "save_switch", "init_from", "profile_dir",
                 "core_dir"):
        setattr(cfg, name, _abs(getattr(cfg, name)))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def train(cfg: TrainConfig) -> TrainResult:
    """Run the job on this rank (under torchrun/srun/self-launch, or alone) and return rank 0's view.

    Equivalent by hand: ``torchrun --nproc-per-node N -m ml_debug.train --preset tiny``.
    """
    from ml_debug.dist import choose_device, detect_world, init_process_group, teardown

    t_start = time.perf_counter()
    _resolve_paths(cfg)
    world = detect_world()
    cfg.validate(world.world_size)
    if cfg.kill_switch is not None and cfg.kill_switch.exists():
        return TrainResult(True, f"kill switch {cfg.kill_switch} exists: not starting", cfg.preset, cfg.numerics,
                           world.world_size, "-", 0, 0, 0, 0, "kill-switch")

    from ml_debug.train.faults import FaultPlan, prepare_core_dir

    plan = FaultPlan(cfg.inject, world.rank)
    if plan.wants_core:
        prepare_core_dir(cfg.core_dir or Path("cores").resolve(), world.rank)

    choice = choose_device(world, cfg.device, cfg.backend)
    distributed = world.world_size > 1
    if distributed:
        init_process_group(world, choice, cfg.timeout)
    state: dict[str, Any] = {}
    ok = False
    try:
        result = _run(cfg, world, choice, plan, state)
        ok = True
        result.elapsed_s = round(time.perf_counter() - t_start, 3)
        return result
    finally:
        # Drop every tensor before destroying the group (gloo's exit crash, FIELD-NOTES).
        state.clear()
        gc.collect()
        if distributed:
            teardown(timeout_s=min(cfg.timeout, 30.0), barrier=ok)


def _run(cfg: TrainConfig, world: Any, choice: Any, plan: Any, state: dict[str, Any]) -> TrainResult:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from ml_debug.train import checkpoint as ckpt
    from ml_debug.train import numerics
    from ml_debug.train.data import TokenStream, default_threads
    from ml_debug.train.metrics import MetricsLog, StepMetrics, flops_per_token, memory_peak, peak_flops
    from ml_debug.train.model import Transformer, count_params, init_weights
    from ml_debug.train.parallel import (
        apply_activation_checkpointing,
        build_optimizer,
        clip_grads,
        grad_sq_norm,
        local_grads,
        lr_at,
        shard_model,
    )

    default_threads()
    device = torch.device(choice.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    distributed = world.world_size > 1
    sharded = distributed and cfg.fsdp
    mcfg = cfg.model
    rank, nranks = world.rank, world.world_size
    log = MetricsLog(cfg.metrics_dir, rank, cfg.log_every, cfg.steps)
    state["log"] = log

    # Build on the meta device (no memory), convert numerics, shard, then materialise and init.
    with torch.device("meta"):
        model = Transformer(mcfg)
    if cfg.numerics == "mx":
        numerics.apply_mx(model, cfg.mx_format, cfg.mx_scale_mode)
    elif cfg.numerics == "fp8":
        emulate = device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9)
        numerics.apply_fp8(model, emulate=emulate)
    apply_activation_checkpointing(model, cfg.activation_checkpoint, cfg.ac_every)
    if sharded:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (nranks,))
        shard_model(model, cfg, mesh)
    model.to_empty(device="cpu" if cfg.cpu_offload and sharded else device)
    if cfg.init_from is not None:
        if sharded:
            ckpt.load_full_from_rank0(model, cfg.init_from, rank == 0)
        else:
            model.load_state_dict(torch.load(cfg.init_from, map_location=device, weights_only=True), strict=True)
        init_weights_rope_only(model)
    else:
        init_weights(model, cfg.seed)
    if cfg.cpu_offload and sharded:
        model.rope = model.rope.to(device)
    numerics.install_stats_hooks(model, fp8=cfg.numerics == "fp8")
    state["model"] = model
    n_params = count_params(model)
    n_params_all = count_params(model, exclude_embedding=False)

    optimizer = build_optimizer(model, cfg, device.type)
    state["optimizer"] = optimizer
    stream = TokenStream.open(cfg.data, cfg.seq_len, cfg.batch_size, rank, nranks)

    start_step = 0
    if cfg.checkpoint_dir is not None and cfg.resume:
        found = ckpt.latest_complete(cfg.checkpoint_dir)
        if found is not None:
            start_step = ckpt.load(found[1], model, optimizer, stream)
            log.say(f"resumed from {found[1]} (step {start_step}, data position {stream.position})")
            log.event(f"resume step={start_step}")

    recompute = {"none": 0.0, "full": 1.0}.get(cfg.activation_checkpoint, 1.0 / cfg.ac_every)
    fpt_model, fpt_hw = flops_per_token(mcfg, n_params, cfg.seq_len, recompute)
    peak = peak_flops(torch.cuda.get_device_name(device) if device.type == "cuda" else None, cfg.numerics)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if cfg.numerics == "bf16" and not sharded
                else contextlib.nullcontext())
    tokens_per_step = cfg.batch_size * cfg.seq_len * cfg.grad_accum
    log.say(f"{mcfg.name}: {n_params_all / 1e6:.2f}M params ({n_params / 1e6:.2f}M non-embedding), "
            f"{nranks} rank(s) on {device.type}/{choice.backend}, numerics {describe_numerics(cfg)}, "
            f"fsdp {'on' if sharded else 'off'}, ac {cfg.activation_checkpoint}, "
            f"global batch {tokens_per_step * nranks} tokens")

    result = TrainResult(True, "", cfg.preset, cfg.numerics, nranks, device.type, n_params, start_step,
                         start_step, 0, "completed")
    speeds: list[tuple[float, float, float]] = []
    last_compute = 0.0
    profiler = None
    saved_at = -1

    for step in range(start_step + 1, cfg.steps + 1):
        kill = cfg.kill_switch is not None and cfg.kill_switch.exists()
        save_now = cfg.save_switch is not None and cfg.save_switch.exists()
        t_step = time.perf_counter()
        if cfg.profile_steps and step == cfg.profile_steps[0]:
            profiler = _start_profiler(device)
        stats_step = cfg.stats_every > 0 and (step % cfg.stats_every == 0 or step == cfg.steps)
        numerics.set_collect_stats(model, stats_step)

        data_time = 0.0
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        loss_bad = False
        try:
            event = plan.before_step(step, last_compute)
            t_compute = time.perf_counter()
            for micro in range(cfg.grad_accum):
                t_data = time.perf_counter()
                inputs, targets = stream.micro_batch(cfg.grad_accum, micro)
                inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
                data_time += time.perf_counter() - t_data
                if sharded and cfg.grad_accum > 1:
                    model.set_requires_gradient_sync(micro == cfg.grad_accum - 1)
                with autocast:
                    logits = model(inputs)
                loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
                if micro == 0 and plan.poison_loss(step):
                    loss = loss * float("nan")
                loss_sum += loss.detach().double()
                (loss / cfg.grad_accum).backward()
            stream.advance(cfg.grad_accum)
            grads = local_grads(model)
            if plan.poison_grad(step) and grads:
                grads[0].view(-1)[0] = float("nan")
            sq = grad_sq_norm(grads)
            local_loss = float(loss_sum) / cfg.grad_accum
            loss_bad = not math.isfinite(local_loss)
            grad_bad = not math.isfinite(float(sq))
            # One collective for every per-step agreement: [loss flags | grad flags | sq, loss, kill, save].
            agree = torch.zeros(2 * nranks + 4, dtype=torch.float64)
            agree[rank] = float(loss_bad)
            agree[nranks + rank] = float(grad_bad)
            agree[2 * nranks:] = torch.tensor([0.0 if grad_bad else float(sq), 0.0 if loss_bad else local_loss,
                                               float(kill), float(save_now)], dtype=torch.float64)
            if distributed:
                agree = agree.to(device)
                dist.all_reduce(agree)
                agree = agree.cpu()
        except MLDebugError:
            raise
        except Exception as e:
            if distributed and _is_collective_error(e):
                raise CollectiveFailure(
                    f"rank {rank}: a collective failed at step {step}: {_first_line(e)}",
                    "another rank is hung, slow or gone: `mldebug dump-stacks --local` (or --slurm-job) "
                    "names it; with --metrics-dir compare each rank's last step") from e
            raise
        bad_loss = [r for r in range(nranks) if agree[r] > 0]
        bad_grad = [r for r in range(nranks) if agree[nranks + r] > 0]
        if bad_loss or bad_grad:
            what = (f"non-finite loss on rank {', '.join(map(str, bad_loss))}" if bad_loss
                    else f"non-finite gradient on rank {', '.join(map(str, bad_grad))}")
            log.event(f"nonfinite step={step} loss_ranks={bad_loss} grad_ranks={bad_grad}")
            raise NonFiniteError(
                f"{what} at step {step}, detected before the optimizer step (no update applied)",
                "resume from the last checkpoint with a lower --lr, or look at the numerics stats in "
                "--metrics-dir (saturation/underflow per layer)")
        total_norm = math.sqrt(float(agree[2 * nranks]))
        global_loss = float(agree[2 * nranks + 1]) / nranks
        clip_grads(grads, total_norm, cfg.grad_clip)
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        optimizer.zero_grad(set_to_none=cfg.zero_grad_set_to_none)
        del grads
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        now = time.perf_counter()
        last_compute = now - t_compute
        step_time = now - t_step

        if profiler is not None and cfg.profile_steps and step == cfg.profile_steps[1]:
            result.profile_trace = _stop_profiler(profiler, cfg, rank)
            profiler = None
            log.say(f"profiler trace of steps {cfg.profile_steps[0]}..{step}: {result.profile_trace}")

        tps = tokens_per_step / step_time
        tflops = fpt_model * tps / 1e12
        metrics = StepMetrics(
            step=step, rank=rank, loss=global_loss, local_loss=local_loss, grad_norm=total_norm, lr=lr,
            tokens=tokens_per_step, step_time_s=step_time, data_time_s=data_time, tokens_per_s=tps,
            tflops=tflops, hw_tflops=fpt_hw * tps / 1e12,
            mfu=(fpt_model * tps / peak) if peak else None, memory=memory_peak(),
            numerics_stats=numerics.gather_stats(model) if stats_step else None, event=event)
        log.step(metrics)
        if metrics.numerics_stats:
            result.numerics_stats = metrics.numerics_stats
        if step > start_step + 1 or cfg.steps == start_step + 1:
            speeds.append((tps, tflops, step_time))
        result.losses[step] = global_loss
        result.last_step = step
        result.steps_run += 1

        every = cfg.checkpoint_every and step % cfg.checkpoint_every == 0
        save_switch = agree[2 * nranks + 3] > 0
        if cfg.checkpoint_dir is not None and (every or save_switch):
            folder = ckpt.save(cfg.checkpoint_dir, step, model, optimizer, stream, cfg.keep_last)
            saved_at = step
            result.checkpoints.append(str(folder))
            log.event(f"checkpoint step={step}")
            if save_switch:
                log.say(f"save switch: saved {folder}")
                if rank == 0 and cfg.save_switch is not None:
                    with contextlib.suppress(FileNotFoundError):
                        cfg.save_switch.unlink()
        if agree[2 * nranks + 2] > 0:
            result.stopped_by = "kill-switch"
            log.say(f"kill switch {cfg.kill_switch} found: stopping after step {step}")
            log.event(f"kill-switch step={step}")
            break

    if profiler is not None:
        result.profile_trace = _stop_profiler(profiler, cfg, rank)
    if cfg.checkpoint_dir is not None and result.stopped_by == "completed" and saved_at != result.last_step \
            and result.steps_run:
        result.checkpoints.append(str(ckpt.save(cfg.checkpoint_dir, result.last_step, model, optimizer, stream,
                                                cfg.keep_last)))
    log.close()

    if speeds:
        result.tokens_per_s = statistics.median(s[0] for s in speeds)
        result.tflops = statistics.median(s[1] for s in speeds)
        result.step_time_s = statistics.median(s[2] for s in speeds)
        result.mfu = (fpt_model * result.tokens_per_s / peak) if peak else None
    if result.losses:
        result.final_loss = result.losses[result.last_step]
    first = result.losses.get(start_step + 1)
    trend = f"loss {first:.3f} -> {result.final_loss:.3f}" if first is not None and result.final_loss is not None \
        else "no steps run"
    result.summary = (f"{mcfg.name} on {nranks} rank(s), {cfg.numerics}: steps {start_step + 1}..{result.last_step} "
                      f"{result.stopped_by}, {trend}")
    return result


def describe_numerics(cfg: TrainConfig) -> str:
    if cfg.numerics == "mx":
        return f"mx {cfg.mx_format} ({cfg.mx_scale_mode} scales)"
    return cfg.numerics


def init_weights_rope_only(model: Any) -> None:
    from ml_debug.train.model import rope_tables

    c = model.cfg
    model.rope = rope_tables(c.dim // c.n_heads, c.max_seq_len, c.rope_theta, device=model.rope.device)


def _is_collective_error(e: BaseException) -> bool:
    name = type(e).__name__
    text = str(e).lower()
    return name in ("DistBackendError", "DistNetworkError", "DistStoreError") or any(
        w in text for w in ("gloo", "nccl", "timed out", "connection closed", "connection reset", "broken pipe"))


def _start_profiler(device: Any) -> Any:
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=activities, record_shapes=True)
    prof.start()
    return prof


def _stop_profiler(prof: Any, cfg: TrainConfig, rank: int) -> str:
    prof.stop()
    where = cfg.profile_dir or (cfg.metrics_dir / "profile" if cfg.metrics_dir else Path("profile").resolve())
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"rank-{rank}.trace.json"
    prof.export_chrome_trace(str(path))
    return str(path)


def env_summary() -> dict[str, str]:
    keys = ("OMP_NUM_THREADS", "TORCH_DISTRIBUTED_DEBUG", "NCCL_DEBUG")
    return {k: os.environ[k] for k in keys if k in os.environ}
