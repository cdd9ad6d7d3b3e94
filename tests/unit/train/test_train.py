"""The training job's parts in one process: config, data, schedule, FLOPs, MX linear, every numerics mode."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from ml_debug.core.errors import UsageError
from ml_debug.train import mx
from ml_debug.train.config import PRESETS, TrainConfig, parse_fault, parse_profile_steps
from ml_debug.train.data import TokenStream, decode, encode, synthetic_text


def test_parse_fault() -> None:
    f = parse_fault("straggler@step=4,rank=1,factor=2.5")
    assert (f.kind, f.step, f.rank, f.factor) == ("straggler", 4, 1, 2.5)
    assert parse_fault("nan@step=2,rank=0,where=grad").where == "grad"
    assert parse_fault("exit@step=1,rank=1,code=3").code == 3
    for bad in ("melt@step=1", "hang@step=x", "hang@rank", "nan@step=1,where=disk"):
        with pytest.raises(UsageError):
            parse_fault(bad)


def test_profile_steps_and_validation() -> None:
    assert parse_profile_steps("3:5") == (3, 5) and parse_profile_steps("4") == (4, 4)
    with pytest.raises(UsageError):
        parse_profile_steps("a:b")
    with pytest.raises(UsageError, match="multiple of 32"):
        TrainConfig(numerics="mx", batch_size=1, seq_len=40).validate()
    with pytest.raises(UsageError):
        TrainConfig(preset="huge").validate()


def test_compile_reaches_the_ranks_and_compiles_every_block() -> None:
    """`--compile` travels to self-launched ranks (to_argv), and compile_blocks wraps each block in place
    (the real torch.compile run is the gpu-marked test_compiled_blocks_train_fp8_on_one_gpu: on 2 CPU
    cores inductor takes minutes)."""
    from ml_debug.core.options import to_argv
    from ml_debug.train.model import Transformer
    from ml_debug.train.parallel import compile_blocks

    assert "--compile" in to_argv(TrainConfig(compile_blocks=True))
    assert "--compile" not in to_argv(TrainConfig())
    with torch.device("meta"):
        model = Transformer(PRESETS["tiny"])
    blocks = list(model.layers.values())
    assert compile_blocks(model) == len(blocks) > 0
    assert all(getattr(b, "_compiled_call_impl", None) is not None for b in blocks)
    assert list(model.layers.values()) == blocks  # compiled in place: FSDP2 still wraps the same modules


def test_presets_fit_mx_blocks() -> None:
    for cfg in PRESETS.values():
        assert cfg.dim % 32 == 0 and cfg.ffn_dim % 32 == 0 and cfg.dim % cfg.n_heads == 0
        assert cfg.n_heads % cfg.n_kv_heads == 0


def test_data_is_deterministic_and_rank_strided() -> None:
    assert synthetic_text(4096) == synthetic_text(4096)
    assert decode(encode("héllo")) == "héllo"
    one = TokenStream.open("synthetic", 16, 4, 0, 1)
    two = [TokenStream.open("synthetic", 16, 2, r, 2) for r in (0, 1)]
    x1, y1 = one.micro_batch(1, 0)
    parts = [s.micro_batch(1, 0)[0] for s in two]
    # 2 ranks x 2 sequences cover the same global batch as 1 rank x 4, interleaved by rank.
    assert torch.equal(torch.stack([parts[0][0], parts[1][0], parts[0][1], parts[1][1]]), x1)
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    one.advance(1)
    assert one.state_dict()["position"] == 4
    assert not torch.equal(one.micro_batch(1, 0)[0], x1)


def test_stdlib_source_reads_python_text() -> None:
    stream = TokenStream.open("stdlib", 32, 2, 0, 1)
    assert b"def " in bytes(stream.corpus[:200000].tolist())


def test_lr_schedule() -> None:
    from ml_debug.train.parallel import lr_at

    cfg = TrainConfig(lr=1.0, warmup_steps=4, steps=14, min_lr_ratio=0.1)
    assert [lr_at(s, cfg) for s in (1, 2, 4)] == [0.25, 0.5, 1.0]
    assert lr_at(14, cfg) == pytest.approx(0.1)
    assert lr_at(9, cfg) == pytest.approx(0.55)  # cosine midpoint
    cfg.schedule = "linear"
    assert lr_at(9, cfg) == pytest.approx(0.55)
    cfg.schedule = "constant"
    assert lr_at(14, cfg) == 1.0


def test_flops_and_peaks() -> None:
    from ml_debug.train.metrics import flops_per_token, peak_flops

    cfg = PRESETS["tiny"]
    model, hw = flops_per_token(cfg, 1000, 64)
    assert model == hw == 6 * 1000 + 12 * cfg.n_layers * cfg.dim * 64
    _, hw_full = flops_per_token(cfg, 1000, 64, recompute_fraction=1.0)
    assert hw_full == pytest.approx(8 * 1000 + 16 * cfg.n_layers * cfg.dim * 64)
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12
    assert peak_flops("NVIDIA H100 80GB HBM3", "fp8") == 1979e12
    assert peak_flops(None, "bf16") is None and peak_flops("Some CPU", "bf16") is None


def test_init_is_the_same_for_any_layout() -> None:
    from ml_debug.train.model import Transformer, count_params, init_weights

    torch.manual_seed(0)
    a = Transformer(PRESETS["tiny"])
    with torch.device("meta"):
        b = Transformer(PRESETS["tiny"])
    b.to_empty(device="cpu")
    init_weights(a, 7)
    init_weights(b, 7)
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), na
    assert count_params(a) < count_params(a, exclude_embedding=False)
    tokens = torch.randint(0, 256, (2, 16))
    assert a(tokens).shape == (2, 16, 256)


def test_mx_linear_quantises_each_gemm_along_its_reduction_dim() -> None:
    from ml_debug.train.numerics import MXLinear, apply_mx

    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(64, 96, bias=False))
    apply_mx(lin, "fp8_e4m3", "floor")
    layer = lin[0]
    assert isinstance(layer, MXLinear)
    x = torch.randn(2, 32, 64, requires_grad=True)
    dy = torch.randn(2, 32, 96)
    y = layer(x)
    y.backward(dy)

    def fq(t: torch.Tensor) -> torch.Tensor:
        return mx.fake_quantize(t.contiguous(), "fp8_e4m3", "floor")

    w = layer.weight.detach()
    x2, dy2 = x.detach().reshape(64, 64), dy.reshape(64, 96)
    assert torch.equal(y.detach().reshape(64, 96), fq(x2) @ fq(w).t())  # along in_features
    assert torch.equal(x.grad.reshape(64, 64), fq(dy2) @ fq(w.t()).t())  # along out_features
    assert torch.equal(layer.weight.grad, fq(dy2.t()) @ fq(x2.t()).t())  # along tokens
    # ... and it is really quantised: differs from the plain GEMM.
    assert not torch.equal(y.detach().reshape(64, 96), x2 @ w.t())


def _train(tmp_path: Path, **kw: object) -> object:
    from ml_debug.train.loop import train

    args: dict[str, object] = {"steps": 12, "batch_size": 2, "seq_len": 32, "warmup_steps": 2, "log_every": 100,
                               "stats_every": 6, **kw}
    cfg = TrainConfig(**args)  # type: ignore[arg-type]
    return train(cfg)


@pytest.mark.parametrize("numerics, extra", [
    ("fp32", {}),
    ("bf16", {}),
    ("fp8", {}),
    ("mx", {"mx_format": "fp8_e4m3"}),
    ("mx", {"mx_format": "fp8_e5m2", "mx_scale_mode": "rceil"}),
    ("mx", {"mx_format": "fp6_e2m3"}),
    ("mx", {"mx_format": "fp6_e3m2", "mx_scale_mode": "rceil"}),
    ("mx", {"mx_format": "fp4_e2m1"}),
    ("mx", {"mx_format": "int8"}),
])
def test_every_numerics_mode_trains(tmp_path: Path, numerics: str, extra: dict) -> None:
    result = _train(tmp_path, numerics=numerics, **extra)
    losses = [result.losses[s] for s in sorted(result.losses)]
    assert len(losses) == 12 and all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0] - 0.5, losses
    stats = result.numerics_stats
    assert stats and "layers.0.attention.wq" in stats and "output" not in stats
    if numerics == "mx":
        roles = stats["layers.0.feed_forward.w2"]
        assert set(roles) == {"act", "weight", "grad"}
        assert all(0 <= r["saturated_frac"] <= 1 and 0 <= r["underflow_frac"] <= 1 for r in roles.values())


def test_mx_changes_the_losses(tmp_path: Path) -> None:
    fp32 = _train(tmp_path, numerics="fp32", steps=4)
    mxfp4 = _train(tmp_path, numerics="mx", mx_format="fp4_e2m1", steps=4)
    assert fp32.losses[1] != mxfp4.losses[1]  # quantisation is really on, from the first forward
    assert abs(fp32.losses[4] - mxfp4.losses[4]) > 1e-4


def test_accumulation_checkpointing_and_options(tmp_path: Path) -> None:
    base = _train(tmp_path, steps=3)
    # Activation checkpointing recomputes exactly the same numbers.
    full = _train(tmp_path, steps=3, activation_checkpoint="full")
    sel = _train(tmp_path, steps=3, activation_checkpoint="selective", optimizer_impl="for-loop",
                 zero_grad_set_to_none=False)
    assert full.losses == base.losses
    assert sel.losses[1] == base.losses[1]
    accum = _train(tmp_path, steps=3, grad_accum=2, grad_clip=0.0, schedule="linear")
    assert all(math.isfinite(v) for v in accum.losses.values())


def test_profile_writes_a_trace(tmp_path: Path) -> None:
    result = _train(tmp_path, steps=3, profile_steps=(2, 3), profile_dir=tmp_path / "prof")
    trace = Path(result.profile_trace)
    assert trace == (tmp_path / "prof" / "rank-0.trace.json") and trace.stat().st_size > 1000


def test_full_state_dict_round_trip(tmp_path: Path) -> None:
    from ml_debug.train.loop import train

    first = _train(tmp_path, steps=2, checkpoint_dir=tmp_path / "ck")
    assert first.checkpoints and (Path(first.checkpoints[-1]) / "COMPLETE").is_file()
    from ml_debug.train.model import Transformer, init_weights

    model = Transformer(PRESETS["tiny"])
    init_weights(model, 99)
    torch.save(model.state_dict(), tmp_path / "full.pt")
    cfg = TrainConfig(steps=1, batch_size=2, seq_len=32, init_from=tmp_path / "full.pt", log_every=100)
    other = TrainConfig(steps=1, batch_size=2, seq_len=32, seed=99, log_every=100)
    assert train(cfg).losses == train(other).losses


def test_agreement_sum_names_bad_ranks_and_any_switch() -> None:
    from ml_debug.train.agreement import Contribution, pack, unpack

    ranks = [Contribution(loss=2.0, grad_sq=4.0, kill=False, save=False),
             Contribution(loss=float("nan"), grad_sq=9.0, kill=True, save=False),
             Contribution(loss=3.0, grad_sq=float("inf"), kill=False, save=True),
             Contribution(loss=1.0, grad_sq=16.0, kill=True, save=False)]
    # The SUM that the all_reduce does, over every rank's packed vector.
    total = sum(pack(c, r, 4) for r, c in enumerate(ranks))
    agreed = unpack(total, 4)
    assert (agreed.loss_bad_ranks, agreed.grad_bad_ranks) == ([1], [2]) and not agreed.finite
    # A bad value contributes 0, so the sums of the others stay finite and readable.
    assert agreed.loss_sum == 6.0 and agreed.loss == 1.5
    assert agreed.grad_sq == 29.0 and agreed.grad_norm == math.sqrt(29.0)
    assert agreed.kill and agreed.save
    calm = unpack(pack(Contribution(loss=2.5, grad_sq=1.0, kill=False, save=False), 0, 1), 1)
    assert calm.finite and not calm.kill and not calm.save and calm.loss == 2.5


def test_trainer_step_by_step_with_switches(tmp_path: Path) -> None:
    from ml_debug.dist.device import choose_device
    from ml_debug.dist.world import detect_world
    from ml_debug.train.checkpointer import Switches
    from ml_debug.train.faults import FaultPlan
    from ml_debug.train.loop import train
    from ml_debug.train.trainer import Trainer

    save, kill, ck = tmp_path / "SAVE", tmp_path / "KILL", tmp_path / "ck"
    args: dict[str, object] = {"steps": 5, "batch_size": 2, "seq_len": 32, "log_every": 100, "stats_every": 0}
    cfg = TrainConfig(**args, checkpoint_dir=ck, save_switch=save, kill_switch=kill)  # type: ignore[arg-type]
    world = detect_world({})
    trainer = Trainer(cfg, world, choose_device(world, "cpu", "gloo"), FaultPlan([], 0))
    save.touch()
    first = trainer.train_step(1, trainer.checkpointer.switches())
    assert first.save and not first.kill
    trainer.checkpointer.after_step(1, first.save)
    assert (ck / "step-1" / "COMPLETE").is_file() and not save.exists(), "saved, and the switch consumed"
    second = trainer.train_step(2, Switches(kill=True, save=False))
    assert second.kill and not second.save
    result = trainer.summary()
    assert (result.start_step, result.last_step, result.steps_run) == (0, 2, 2)
    assert result.checkpoints == [str(ck / "step-1")] and result.final_loss == second.loss
    trainer.close()
    assert not hasattr(trainer, "model") and not hasattr(trainer, "optimizer")
    # The steps are the ones train() runs.
    assert train(TrainConfig(**args)).losses.items() >= {1: first.loss, 2: second.loss}.items()  # type: ignore[arg-type]


def test_kill_switch_present_at_start_runs_no_step(tmp_path: Path) -> None:
    # Checked before anything starts (ml_debug/train/loop.py); an ok result is `mldebug train`'s exit 0,
    # as tests/cli/test_train.py::test_save_switch_then_kill_switch checks for a kill switch mid-run.
    from ml_debug.train.loop import train

    kill = tmp_path / "KILL"
    kill.touch()
    result = train(TrainConfig(steps=5, batch_size=2, seq_len=32, kill_switch=kill))
    assert result.ok and result.stopped_by == "kill-switch"
    assert (result.steps_run, result.last_step) == (0, 0)
    assert "not starting" in result.summary
