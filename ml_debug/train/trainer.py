"""The :class:`Trainer` one rank runs: build, ``train_step``, checkpoints, summary.

* build (the constructor): device, device mesh, the model (on the meta device, then numerics,
  activation checkpointing, FSDP2 wrapping, materialised and initialised or loaded), optimizer,
  data stream, checkpointer (and the resume), FLOP counts;
* ``train_step``: faults due now, micro-batches (forward, loss, backward; gradient sync only on the
  last one), the step's agreement (one all_reduce, see ``agreement.py``), the non-finite check,
  clipping, the optimizer step and the step's metrics;
* ``run``: the loop of steps with saves and the kill switch, then :meth:`Trainer.summary`, the
  :class:`TrainResult`.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F

from ml_debug.core.errors import MLDebugError, first_line
from ml_debug.dist.group import is_collective_error
from ml_debug.train import checkpoint as ckpt
from ml_debug.train import numerics
from ml_debug.train.agreement import Contribution, StepAgreement, agree
from ml_debug.train.checkpointer import Checkpointer, Switches
from ml_debug.train.config import TrainConfig
from ml_debug.train.data import TokenStream, default_threads
from ml_debug.train.faults import FaultPlan
from ml_debug.train.metrics import MetricsLog, StepMetrics, flops_per_token, memory_peak, peak_flops
from ml_debug.train.model import Transformer, count_params, init_weights, rope_tables
from ml_debug.train.parallel import (
    apply_activation_checkpointing,
    build_optimizer,
    clip_grads,
    compile_blocks,
    grad_sq_norm,
    local_grads,
    lr_at,
    shard_model,
)
from ml_debug.train.result import CollectiveFailure, NonFiniteError, TrainResult

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

    from ml_debug.dist.device import DeviceChoice
    from ml_debug.dist.world import World


class Trainer:
    """One rank's training job. The constructor builds everything (collectively under FSDP: every
    rank must construct it); :meth:`run` trains; :meth:`close` drops every tensor before teardown."""

    def __init__(self, cfg: TrainConfig, world: World, choice: DeviceChoice, plan: FaultPlan) -> None:
        default_threads()
        self.cfg, self.plan = cfg, plan
        self.rank, self.world_size = world.rank, world.world_size
        self.backend = choice.backend
        self.device = torch.device(choice.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.distributed = self.world_size > 1
        self.sharded = self.distributed and cfg.fsdp
        self.log = MetricsLog(cfg.metrics_dir, self.rank, cfg.log_every, cfg.steps)

        self.mesh = self._build_mesh()
        self.model = self._build_model()
        self.n_params = count_params(self.model)
        self.optimizer = build_optimizer(self.model, cfg, self.device.type)
        self.stream = TokenStream.open(cfg.data, cfg.seq_len, cfg.batch_size, self.rank, self.world_size)
        self.checkpointer = Checkpointer(cfg, self.rank, self.log, self.model, self.optimizer, self.stream)
        self.start_step = self.checkpointer.resume()

        recompute = {"none": 0.0, "full": 1.0}.get(cfg.activation_checkpoint, 1.0 / cfg.ac_every)
        self.flops_model, self.flops_hw = flops_per_token(cfg.model, self.n_params, cfg.seq_len, recompute)
        self.peak = peak_flops(torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None,
                               cfg.numerics)
        # Unsharded bf16 runs under autocast; FSDP2 casts through its mixed-precision policy instead.
        self.autocast: contextlib.AbstractContextManager[Any] = (
            torch.autocast(self.device.type, dtype=torch.bfloat16) if cfg.numerics == "bf16" and not self.sharded
            else contextlib.nullcontext())
        self.tokens_per_step = cfg.batch_size * cfg.seq_len * cfg.grad_accum  # per rank
        self.log.say(self._describe())

        # Progress, read by summary().
        self.losses: dict[int, float] = {}
        self.speeds: list[tuple[float, float, float]] = []  # (tokens/s, TFLOP/s, step time) per step
        self.last_step = self.start_step
        self.steps_run = 0
        self.stopped_by = "completed"
        self.numerics_stats: dict[str, Any] | None = None
        self.profile_trace: str | None = None
        self._profiler: Any = None
        self._last_compute = 0.0  # the previous step's compute time (a straggler sleeps a multiple of it)
        self._closed = False

    # -- build ------------------------------------------------------------------------------------

    def _build_mesh(self) -> Any:
        if not self.sharded:
            return None
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.device.type, (self.world_size,))

    def _build_model(self) -> Transformer:
        """On the meta device (no memory), convert numerics, shard, then materialise and init."""
        cfg, device = self.cfg, self.device
        with torch.device("meta"):
            model = Transformer(cfg.model)
        if cfg.numerics == "mx":
            numerics.apply_mx(model, cfg.mx_format, cfg.mx_scale_mode)
        elif cfg.numerics == "fp8":
            emulate = device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9)
            numerics.apply_fp8(model, emulate=emulate)
        apply_activation_checkpointing(model, cfg.activation_checkpoint, cfg.ac_every)
        if cfg.compile_blocks:
            compile_blocks(model)
        if self.mesh is not None:
            shard_model(model, cfg, self.mesh)
        offload = cfg.cpu_offload and self.sharded
        model.to_empty(device="cpu" if offload else device)
        if cfg.init_from is not None:
            if self.sharded:
                ckpt.load_full_from_rank0(model, cfg.init_from, self.rank == 0)
            else:
                model.load_state_dict(torch.load(cfg.init_from, map_location=device, weights_only=True),
                                      strict=True)
            _rebuild_rope(model)  # a buffer, not in the state dict: to_empty left it uninitialised
        else:
            init_weights(model, cfg.seed)
        if offload:
            model.rope = model.rope.to(device)  # offload moved it to the CPU; the forward needs it here
        numerics.install_stats_hooks(model, fp8=cfg.numerics == "fp8")
        return model

    def _describe(self) -> str:
        cfg = self.cfg
        n_all = count_params(self.model, exclude_embedding=False)
        return (f"{cfg.model.name}: {n_all / 1e6:.2f}M params ({self.n_params / 1e6:.2f}M non-embedding), "
                f"{self.world_size} rank(s) on {self.device.type}/{self.backend}, numerics {_numerics(cfg)}, "
                f"fsdp {'on' if self.sharded else 'off'}, ac {cfg.activation_checkpoint}, "
                f"{'compiled blocks, ' if cfg.compile_blocks else ''}"
                f"global batch {self.tokens_per_step * self.world_size} tokens")

    # -- the loop ---------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        """Train from the step after ``start_step`` to ``cfg.steps`` (or the kill switch)."""
        for step in range(self.start_step + 1, self.cfg.steps + 1):
            agreed = self.train_step(step, self.checkpointer.switches())
            self.checkpointer.after_step(step, agreed.save)
            if agreed.kill:
                self.stopped_by = "kill-switch"
                self.log.say(f"kill switch {self.cfg.kill_switch} found: stopping after step {step}")
                self.log.event(f"kill-switch step={step}")
                break
        if self._profiler is not None:
            self.profile_trace = self._stop_profiler()
        self.checkpointer.final(self.last_step, self.steps_run, completed=self.stopped_by == "completed")
        self.log.close()
        return self.summary()

    def train_step(self, step: int, switches: Switches) -> StepAgreement:
        """One optimizer step on every rank; returns what the ranks agreed on (loss, norm, switches).

        Raises NonFiniteError on every rank, before the optimizer step, when any rank's loss or
        gradient is not finite, and CollectiveFailure when a peer is hung, slow or gone.
        """
        cfg = self.cfg
        t_step = time.perf_counter()
        if cfg.profile_steps and step == cfg.profile_steps[0]:
            self._profiler = _start_profiler(self.device)
        stats_step = cfg.stats_every > 0 and (step % cfg.stats_every == 0 or step == cfg.steps)
        numerics.set_collect_stats(self.model, stats_step)

        try:
            event = self.plan.before_step(step, self._last_compute)
            t_compute = time.perf_counter()
            local_loss, data_time = self._forward_backward(step)
            grads = local_grads(self.model)
            if self.plan.poison_grad(step) and grads:
                grads[0].view(-1)[0] = float("nan")
            mine = Contribution(loss=local_loss, grad_sq=float(grad_sq_norm(grads)), kill=switches.kill,
                                save=switches.save)
            agreed = agree(mine, self.rank, self.world_size, self.device if self.distributed else None)
        except MLDebugError:
            raise
        except Exception as e:
            if self.distributed and is_collective_error(e):
                raise CollectiveFailure(
                    f"rank {self.rank}: a collective failed at step {step}: {first_line(e)}",
                    "another rank is hung, slow or gone: `mldebug dump-stacks --local` (or --slurm-job) "
                    "names it; with --metrics-dir compare each rank's last step") from e
            raise
        self._fail_if_not_finite(step, agreed)

        clip_grads(grads, agreed.grad_norm, cfg.grad_clip)
        lr = lr_at(step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=cfg.zero_grad_set_to_none)
        del grads
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self._last_compute = now - t_compute
        step_time = now - t_step

        if self._profiler is not None and cfg.profile_steps and step == cfg.profile_steps[1]:
            self.profile_trace = self._stop_profiler()
            self.log.say(f"profiler trace of steps {cfg.profile_steps[0]}..{step}: {self.profile_trace}")
        tps = self.tokens_per_step / step_time
        self._record(StepMetrics(
            step=step, rank=self.rank, loss=agreed.loss, local_loss=local_loss, grad_norm=agreed.grad_norm, lr=lr,
            tokens=self.tokens_per_step, step_time_s=step_time, data_time_s=data_time, tokens_per_s=tps,
            tflops=self.flops_model * tps / 1e12, hw_tflops=self.flops_hw * tps / 1e12,
            mfu=(self.flops_model * tps / self.peak) if self.peak else None, memory=memory_peak(),
            numerics_stats=numerics.gather_stats(self.model) if stats_step else None, event=event))
        return agreed

    def _forward_backward(self, step: int) -> tuple[float, float]:
        """Every micro-batch of the step; returns (this rank's mean loss, seconds spent fetching data)."""
        cfg = self.cfg
        data_time = 0.0
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        for micro in range(cfg.grad_accum):
            t_data = time.perf_counter()
            inputs, targets = self.stream.micro_batch(cfg.grad_accum, micro)
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            data_time += time.perf_counter() - t_data
            if self.sharded and cfg.grad_accum > 1:
                # Reduce-scatter the gradients once, after the last micro-batch.
                cast("FSDPModule", self.model).set_requires_gradient_sync(micro == cfg.grad_accum - 1)
            with self.autocast:
                logits = self.model(inputs)
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
            if micro == 0 and self.plan.poison_loss(step):
                loss = loss * float("nan")
            loss_sum += loss.detach().double()
            (loss / cfg.grad_accum).backward()
        self.stream.advance(cfg.grad_accum)
        return float(loss_sum) / cfg.grad_accum, data_time

    def _fail_if_not_finite(self, step: int, agreed: StepAgreement) -> None:
        if agreed.finite:
            return
        bad_loss, bad_grad = agreed.loss_bad_ranks, agreed.grad_bad_ranks
        what = (f"non-finite loss on rank {', '.join(map(str, bad_loss))}" if bad_loss
                else f"non-finite gradient on rank {', '.join(map(str, bad_grad))}")
        self.log.event(f"nonfinite step={step} loss_ranks={bad_loss} grad_ranks={bad_grad}")
        raise NonFiniteError(
            f"{what} at step {step}, detected before the optimizer step (no update applied)",
            "resume from the last checkpoint with a lower --lr, or look at the numerics stats in "
            "--metrics-dir (saturation/underflow per layer)")

    def _record(self, m: StepMetrics) -> None:
        """Log a finished step and keep what the summary needs."""
        self.log.step(m)
        if m.numerics_stats:
            self.numerics_stats = m.numerics_stats
        # The first step pays for warm-up (allocations, lazy init): leave it out of the medians
        # unless it is the only step.
        if m.step > self.start_step + 1 or self.cfg.steps == self.start_step + 1:
            self.speeds.append((m.tokens_per_s, m.tflops, m.step_time_s))
        self.losses[m.step] = m.loss
        self.last_step = m.step
        self.steps_run += 1

    # -- profiler ---------------------------------------------------------------------------------

    def _stop_profiler(self) -> str:
        prof, self._profiler = self._profiler, None
        prof.stop()
        cfg = self.cfg
        where = cfg.profile_dir or (cfg.metrics_dir / "profile" if cfg.metrics_dir else Path("profile").resolve())
        import os
        import shutil
        import tempfile

        from ml_debug.core import safefs

        safefs.make_out_dir(where, "--profile-dir")  # no link of another user followed on the way
        path = where / f"rank-{self.rank}.trace.json"
        # the profiler opens its file by name: it writes in a private folder (mkdtemp, 0700), and the
        # file is renamed into place, so a link planted at the name is replaced, never written through
        tmp = tempfile.mkdtemp(prefix=".profile-", dir=where)
        try:
            prof.export_chrome_trace(os.path.join(tmp, path.name))
            os.replace(os.path.join(tmp, path.name), path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return str(path)

    # -- summary and teardown ---------------------------------------------------------------------

    def summary(self) -> TrainResult:
        """Rank 0's view of the run: losses, medians of the throughput, checkpoints."""
        cfg = self.cfg
        result = TrainResult(True, "", cfg.preset, cfg.numerics, self.world_size, self.device.type, self.n_params,
                             self.start_step, self.last_step, self.steps_run, self.stopped_by,
                             losses=dict(self.losses), checkpoints=list(self.checkpointer.saved),
                             numerics_stats=self.numerics_stats, profile_trace=self.profile_trace)
        if self.speeds:
            result.tokens_per_s = statistics.median(s[0] for s in self.speeds)
            result.tflops = statistics.median(s[1] for s in self.speeds)
            result.step_time_s = statistics.median(s[2] for s in self.speeds)
            result.mfu = (self.flops_model * result.tokens_per_s / self.peak) if self.peak else None
        if result.losses:
            result.final_loss = result.losses[result.last_step]
        first = result.losses.get(self.start_step + 1)
        trend = (f"loss {first:.3f} -> {result.final_loss:.3f}" if first is not None and result.final_loss is not None
                 else "no steps run")
        result.summary = (f"{cfg.model.name} on {self.world_size} rank(s), {cfg.numerics}: steps "
                          f"{self.start_step + 1}..{result.last_step} {result.stopped_by}, {trend}")
        return result

    def close(self) -> None:
        """Drop every tensor this trainer holds (model, optimizer state, data).

        Call before destroying the process group: a tensor freed by a gloo worker thread while
        Python finalises, after the group is gone, aborts the process ("terminate called without an
        active exception") and turns a finished run into a SIGABRT.
        """
        if self._closed:
            return
        self._closed = True
        self._profiler = None
        del self.checkpointer, self.optimizer, self.model, self.stream, self.mesh


def _numerics(cfg: TrainConfig) -> str:
    if cfg.numerics == "mx":
        return f"mx {cfg.mx_format} ({cfg.mx_scale_mode} scales)"
    return cfg.numerics


def _rebuild_rope(model: Any) -> None:
    c = model.cfg
    model.rope = rope_tables(c.dim // c.n_heads, c.max_seq_len, c.rope_theta, device=model.rope.device)


def _start_profiler(device: torch.device) -> Any:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=activities, record_shapes=True)
    prof.start()
    return prof
