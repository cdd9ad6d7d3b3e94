"""`mldebug train` on 2 real gloo ranks: golden loss curve, checkpoints, bit-for-bit resume, switches.

One 50-step run (the golden curve) also saves step-20/40/50 checkpoints; the resume test continues
from a copy of step-40 next to a partial step-45 folder and must reproduce steps 41..50 exactly.
Set MLDEBUG_UPDATE_GOLDEN=1 to rewrite tests/golden/train_tiny_2rank.json from this machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema

from tests.conftest import REPO, mldebug, read_golden
from tests.fakes import pythonpath

GOLDEN = REPO / "tests" / "golden" / "train_tiny_2rank.json"
SCHEMAS = REPO / "ml_debug" / "schemas"
GOLDEN_ARGS = ["train", "--nproc-per-node", "2", "--preset", "tiny", "--steps", "50", "--data", "synthetic",
               "--log-every", "10", "--checkpoint-every", "20", "--keep-last", "3", "--json"]
# Float sums differ a little between CPUs/BLAS builds; a broken model differs by far more.
ABS_TOL, REL_TOL = 0.03, 0.02


def _losses(metrics_dir: Path, rank: int = 0) -> dict[int, float]:
    out = {}
    for line in (metrics_dir / f"rank-{rank}.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "step" in rec:
            out[rec["step"]] = rec["loss"]
    return out


def test_golden_run_its_metrics_and_a_bit_identical_resume(tmp_path: Path) -> None:
    """One 50-step run, read three ways (a module-scoped fixture would run once per xdist worker): the
    loss curve against the golden file, every rank's metrics lines, and a resume from its step-40
    checkpoint beside a partial step-45 that continues bit for bit."""
    golden_run = _golden_run(tmp_path / "golden")
    _check_golden_loss_curve(golden_run)
    _check_metrics_lines_per_rank(golden_run)
    _check_resume_is_bit_identical_and_ignores_partial(golden_run, tmp_path / "resume")


def _golden_run(work: Path) -> dict:
    work.mkdir()
    proc = mldebug(*GOLDEN_ARGS, "--metrics-dir", str(work / "metrics"), "--checkpoint-dir", str(work / "ckpt"),
                   timeout=400, cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    return {"dir": work, "doc": doc, "stderr": proc.stderr}


def _check_golden_loss_curve(golden_run: dict) -> None:
    doc = golden_run["doc"]
    jsonschema.validate(doc, json.loads((SCHEMAS / "train.json").read_text()))
    result = doc["result"]
    assert result["ok"] and result["world_size"] == 2 and result["steps_run"] == 50
    losses = {int(k): v for k, v in result["losses"].items()}
    assert sorted(losses) == list(range(1, 51))
    fresh = json.dumps({"args": GOLDEN_ARGS, "losses": [round(losses[s], 5) for s in range(1, 51)]}, indent=1)
    golden = json.loads(read_golden(GOLDEN, fresh + "\n"))["losses"]
    for step, want in enumerate(golden, start=1):
        got = losses[step]
        assert abs(got - want) <= ABS_TOL + REL_TOL * abs(want), f"step {step}: loss {got:.4f}, golden {want:.4f}"
    # It really learns: the byte stream's structure brings the loss far below uniform (ln 256 = 5.55).
    assert sum(golden[-5:]) / 5 < golden[0] - 2.0


def _check_metrics_lines_per_rank(golden_run: dict) -> None:
    schema = json.loads((SCHEMAS / "train-step.json").read_text())
    metrics = golden_run["dir"] / "metrics"
    for rank in (0, 1):
        lines = [json.loads(x) for x in (metrics / f"rank-{rank}.jsonl").read_text().splitlines()]
        steps = [rec for rec in lines if "step" in rec]
        assert [rec["step"] for rec in steps] == list(range(1, 51))
        for rec in lines:
            jsonschema.validate(rec, schema)
        assert all(rec["rank"] == rank and rec["tokens_per_s"] > 0 for rec in steps)
        assert steps[9]["numerics_stats"], "stats every 10 steps"
    # Every rank logs the same global loss; each its own local loss.
    assert _losses(metrics, 0) == _losses(metrics, 1)
    assert "step 50/50 | loss" in golden_run["stderr"]


def _check_resume_is_bit_identical_and_ignores_partial(golden_run: dict, tmp_path: Path) -> None:
    tmp_path.mkdir()
    ckpt = golden_run["dir"] / "ckpt"
    kept = sorted(p.name for p in ckpt.iterdir())
    assert kept == ["step-20", "step-40", "step-50"]
    assert all((ckpt / k / "COMPLETE").is_file() for k in kept)
    resume_dir = tmp_path / "ckpt"
    resume_dir.mkdir()
    shutil.copytree(ckpt / "step-40", resume_dir / "step-40")
    shutil.copytree(ckpt / "step-50", resume_dir / "step-45")  # a save killed before its marker:
    (resume_dir / "step-45" / "COMPLETE").unlink()  # complete files, no marker
    proc = mldebug(*GOLDEN_ARGS, "--metrics-dir", str(tmp_path / "metrics"), "--checkpoint-dir", str(resume_dir),
                   timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stderr and "step-40" in proc.stderr
    result = json.loads(proc.stdout)["result"]
    assert result["start_step"] == 40 and result["last_step"] == 50
    want = _losses(golden_run["dir"] / "metrics")
    got = _losses(tmp_path / "metrics")
    assert sorted(got) == list(range(41, 51))
    assert all(got[s] == want[s] for s in got), "resume must continue bit for bit"
    # The partial folder was removed by the next save (the end-of-run save of step 50).
    assert not (resume_dir / "step-45").exists()


def _rank_pids(launcher: subprocess.Popen) -> list[int]:
    import psutil

    return [c.pid for c in psutil.Process(launcher.pid).children(recursive=True)]


def _stop(proc: subprocess.Popen) -> None:
    import psutil

    if proc.poll() is None:
        for pid in _rank_pids(proc):
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        proc.kill()
    proc.wait(timeout=30)


def test_save_switch_then_kill_switch(tmp_path: Path) -> None:
    """One save per touch of the save switch: rank 0 is made slow to delete the file (tests/fakes/slow_switch.py),
    and rank 1, quick to its next step, once saw it there again and saved twice."""
    kill, save = tmp_path / "KILL", tmp_path / "SAVE"
    metrics, ckpt = tmp_path / "metrics", tmp_path / "ckpt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MLDEBUG_TEST_HOOKS": "tests.fakes.slow_switch",
           "PYTHONPATH": pythonpath(os.environ)}
    proc = subprocess.Popen([sys.executable, "-m", "ml_debug", "train", "--nproc-per-node", "2", "--steps", "100000",
                             "--log-every", "1000", "--stats-every", "0", "--metrics-dir", str(metrics),
                             "--numerics", "mx", "--mx-format", "fp8_e4m3",  # MX + FSDP2 + DCP on 2 ranks
                             "--checkpoint-dir", str(ckpt), "--kill-switch", str(kill), "--save-switch", str(save),
                             "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            start_new_session=True)
    try:
        def last_step() -> int:
            steps = _losses(metrics) if (metrics / "rank-0.jsonl").exists() else {}
            return max(steps, default=0)

        deadline = time.monotonic() + 120
        while last_step() < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert last_step() >= 3, "the job never reached step 3"
        save.touch()
        while save.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert not save.exists(), "the save switch was never consumed"
        saved = [p for p in ckpt.iterdir() if (p / "COMPLETE").is_file()]
        assert len(saved) == 1
        # the ranks held still while the last step written is read and the switch appears: on a busy machine this
        # test's own process may lag the ranks by several steps between the two
        ranks = _rank_pids(proc)
        for pid in ranks:
            os.kill(pid, signal.SIGSTOP)
        try:
            seen = last_step()
            kill.touch()
        finally:
            for pid in ranks:
                os.kill(pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=120)
    finally:
        _stop(proc)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out)["result"]
    assert result["stopped_by"] == "kill-switch"
    assert len(result["checkpoints"]) == 1, result["checkpoints"]  # the switch's save, once (no end-of-run save)
    # The step running when the file appeared may finish, plus at most one more: "within one step".
    assert seen <= result["last_step"] <= seen + 2
    assert "kill switch" in err
    # A kill switch present at start (nothing runs, an ok result, so exit 0 as here) is
    # tests/unit/train/test_train.py::test_kill_switch_present_at_start_runs_no_step.
