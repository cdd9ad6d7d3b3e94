"""`mldebug check`'s options: --skip as a comma list, --out-dir checked before any step, and what a
step printed before its timeout kept in --out-dir (the step is held by tests/fakes/held_checks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import mldebug
from tests.fakes.held_checks import hook_env


def _usage_error(proc, words: str) -> None:  # type: ignore[no-untyped-def]
    assert proc.returncode == 2, proc.stderr
    first, hint = proc.stderr.splitlines()[:2]
    assert first.startswith("mldebug: error:") and words in first and hint.startswith("hint:"), proc.stderr


@pytest.mark.parametrize(("skip", "words"), [
    (["env,gpu-test,health,allreduce-bench"], "nothing to run"),
    (["env,gpu-test", "--skip", "health , allreduce-bench"], "nothing to run"),  # the lists are joined
    (["env,bogus"], "unknown step 'bogus'"),
])
def test_skip_takes_comma_lists_and_must_leave_a_step(skip: list[str], words: str) -> None:
    _usage_error(mldebug("check", "--skip", *skip, timeout=60), words)


def test_help_shows_the_skip_list_form() -> None:
    assert "--skip STEP[,STEP]" in mldebug("check", "--help", timeout=60).stdout


@pytest.mark.parametrize(("out_dir", "words"), [("", "--out-dir is empty"), ("/proc/nonexist/x", "--out-dir")])
def test_a_bad_out_dir_is_said_before_any_step(out_dir: str, words: str, tmp_path: Path) -> None:
    proc = mldebug("check", "--skip", "env,gpu-test,allreduce-bench", "--out-dir", out_dir,
                   env=hook_env(tmp_path), cwd=tmp_path, timeout=60)
    _usage_error(proc, words)
    assert not (tmp_path / "started").exists()  # the health step never ran
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # and nothing was written here


def test_a_timed_out_step_keeps_what_it_printed_in_out_dir(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for limit in ("2", "8", "30"):  # until the step reached the hold (a loaded machine starts slowly)
        proc = mldebug("check", "--json", "--skip", "env,gpu-test", "--skip", "allreduce-bench",
                       "--step-timeout", limit, "--out-dir", str(out), env=hook_env(tmp_path, hold=True),
                       timeout=120)
        assert proc.returncode == 4, proc.stderr
        if (tmp_path / "started").exists():
            break
    said = (out / "check.health.stderr").read_text().splitlines()
    assert "stuck at the NVML hook" in said and said[-1] == "mldebug: error: interrupted by SIGTERM"  # stopped
    assert (out / "check.health.json").read_text().startswith("printed before the hold\n")  # then its error document


def test_ctrl_c_reports_the_steps_done_and_keeps_the_running_ones_output(tmp_path: Path) -> None:
    """Ctrl-C while the health step is held: exit 130 with env's verdict and health 'interrupted' in the
    report (before, only "interrupted"), what health printed in --out-dir, and no process left."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import uuid

    from tests.conftest import pids_with_env, validate_schema, wait_until

    token = uuid.uuid4().hex
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MLDEBUG_CHECK_TEST": token, **hook_env(tmp_path, hold=True)}
    proc = subprocess.Popen([sys.executable, "-m", "ml_debug", "check", "--json", "--skip", "gpu-test,allreduce-bench",
                             "--out-dir", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        wait_until(lambda: (tmp_path / "started").exists(), 120, "the health step to reach its hold")
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole foreground group
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    doc = json.loads(stdout)
    validate_schema(doc, "check")
    steps = {s["name"]: s["status"] for s in doc["result"]["steps"]}
    assert steps == {"env": "pass", "gpu-test": "skipped", "health": "interrupted"}, steps
    assert not doc["result"]["ok"] and doc["result"]["exit_code"] == 130
    assert (out / "check.env.json").exists() and (out / "check.health.json").read_text().startswith("printed before the hold\n")  # then its error document
    wait_until(lambda: not pids_with_env("MLDEBUG_CHECK_TEST", token), 10, "the check's processes to be gone")
