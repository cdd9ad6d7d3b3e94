"""`mldebug train --inject`: every fault does exactly what it says, on 2 real gloo ranks.

The hang and crash faults are checked on the evidence of `mldebug drill`'s hang and crash drills, which run
the same faults (tests/cli/test_drill.py): one real job each, not two."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, mldebug, require

BASE = ["train", "--nproc-per-node", "2", "--steps", "5", "--stats-every", "0", "--log-every", "100"]


def _steps(metrics: Path, rank: int) -> list[dict]:
    path = metrics / f"rank-{rank}.jsonl"
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if "step" in r]


def test_nan_names_the_rank_before_the_optimizer_step(tmp_path: Path) -> None:
    metrics = tmp_path / "m"
    # fp8 (torchao float8, emulated on CPU) under FSDP2 on the way.
    proc = mldebug(*BASE, "--inject", "nan@step=3,rank=1", "--metrics-dir", str(metrics), "--collective-timeout", "30",
                   "--numerics", "fp8", timeout=240, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "non-finite loss on rank 1 at step 3, detected before the optimizer step" in proc.stderr
    for rank in (0, 1):
        assert [r["step"] for r in _steps(metrics, rank)] == [1, 2]  # no update at step 3


def test_nan_in_a_gradient() -> None:
    # The same check in one process (no launch needed): the rank with the poisoned shard is named.
    from ml_debug.train.config import TrainConfig, parse_fault
    from ml_debug.train.loop import NonFiniteError, train

    cfg = TrainConfig(steps=3, batch_size=2, seq_len=32, log_every=100,
                      inject=[parse_fault("nan@step=2,rank=0,where=grad")])
    with pytest.raises(NonFiniteError, match="non-finite gradient on rank 0 at step 2"):
        train(cfg)


def test_straggler_slows_only_its_rank_and_a_segfault_leaves_a_core(tmp_path: Path) -> None:
    """Two faults on rank 1 in one job (``--inject`` repeats): a straggler from step 2, a segfault at step 4."""
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    import resource

    require(not pattern.startswith("|") and "/" not in pattern,
            f"core files in the crashing process's cwd (kernel.core_pattern is {pattern!r})")
    require(resource.getrlimit(resource.RLIMIT_CORE)[1] != 0, "a non-zero hard core-size limit")
    import torch

    from ml_debug.train.config import PRESETS
    from ml_debug.train.model import Transformer, init_weights

    # Start from a full state dict that rank 0 loads and broadcasts (the low-memory start): the
    # seed-1234 weights, so step 1 (before any update) must give the golden curve's first loss.
    model = Transformer(PRESETS["tiny"])
    init_weights(model, 1234)
    torch.save(model.state_dict(), tmp_path / "full.pt")
    metrics, cores = tmp_path / "m", tmp_path / "cores"
    proc = mldebug(*BASE, "--inject", "straggler@step=2,rank=1,factor=3", "--inject", "segfault@step=4,rank=1",
                   "--init-from", str(tmp_path / "full.pt"), "--seed", "1", "--metrics-dir", str(metrics),
                   "--core-dir", str(cores), "--collective-timeout", "30", timeout=240, cwd=tmp_path)
    assert proc.returncode == 4, proc.stderr[-2000:]  # documented: a rank killed by a signal, a segfault
    assert "Segmentation fault" in proc.stderr and "injected_segfault" in proc.stderr
    files = [p for p in (cores / "rank-1").iterdir() if p.name.startswith("core")]
    assert files, "no core file in cores/rank-1"
    assert not list((cores / "rank-0").glob("core*")), "rank 0 did not crash"
    assert not list(REPO.glob("core*")) and not list(REPO.glob("cores"))

    golden = json.loads((REPO / "tests" / "golden" / "train_tiny_2rank.json").read_text())["losses"]
    assert abs(_steps(metrics, 0)[0]["loss"] - golden[0]) < 1e-4
    # Rank 1's lines of steps 1..3 survive its segfault at the start of step 4 (line-buffered file).
    slow = _steps(metrics, 1)
    assert [r["step"] for r in slow] == [1, 2, 3]
    assert slow[0]["event"] is None
    assert all(r["event"] and r["event"].startswith("injected straggler delay") for r in slow[1:])
    assert all(r["event"] is None for r in _steps(metrics, 0))


def test_desync_issues_a_different_collective(tmp_path: Path) -> None:
    proc = mldebug(*BASE, "--inject", "desync@step=2,rank=1", "--collective-timeout", "5", timeout=240, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "rank 1: injected desync at step 2" in proc.stderr
    assert "a collective failed at step 2" in proc.stderr


def test_exit_is_silent(tmp_path: Path) -> None:
    metrics = tmp_path / "m"
    proc = mldebug(*BASE, "--inject", "exit@step=3,rank=1", "--metrics-dir", str(metrics),
                   "--collective-timeout", "30", "--numerics", "bf16", timeout=240, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "rank 0: a collective failed at step 3" in proc.stderr
    assert "Traceback" not in proc.stderr  # rank 1 says nothing
    assert [r["step"] for r in _steps(metrics, 1)] == [1, 2]


@pytest.mark.parametrize("spec, message", [
    ("boom@step=1", "unknown fault"),
    ("hang@step=0,rank=0", "need step >= 1"),
    ("hang@step=1,rank=5", "does not exist in a world of 2"),
    ("hang@step=1,colour=red", "unknown key"),
])
def test_bad_inject_is_a_usage_error(spec: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from ml_debug.cli.app import run

    assert run(["train", "--nproc-per-node", "2", "--inject", spec]) == 2
    err = capsys.readouterr().err
    assert message in err and "hint:" in err
