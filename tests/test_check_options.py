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
    assert (out / "check.health.stderr").read_text().splitlines()[-1] == "stuck at the NVML hook"
    assert (out / "check.health.json").read_text() == "printed before the hold\n"
