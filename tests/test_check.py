"""`mldebug check`: each step a real subprocess with --json and a timeout, one verdict."""

from __future__ import annotations

import json
import time

import jsonschema
import psutil

from ml_debug import checkup
from ml_debug.checkup import PASS, TIMEOUT, UNAVAILABLE, Step, StepResult, judge, run_check, run_step
from tests.conftest import REPO, mldebug

SCHEMA = json.loads((REPO / "ml_debug" / "schemas" / "check.json").read_text())


def test_check_runs_env_and_gpu_test_on_a_node_without_gpu() -> None:
    r = mldebug("check", "--json", "--skip", "health", "--skip", "allreduce-bench", timeout=400)
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    steps = {s["name"]: s for s in doc["result"]["steps"]}
    assert steps["env"]["status"] == PASS and steps["env"]["schema"] == "mldebug.env"
    assert steps["gpu-test"]["status"] == PASS, steps["gpu-test"]
    assert steps["gpu-test"]["summary"].endswith("ranks OK on 1 host")
    assert steps["health"]["status"] == "skipped"
    assert r.returncode == 0 and doc["result"]["ok"]


def test_unregistered_command_is_not_available_not_a_failure() -> None:
    res = run_check(steps=[Step("future", ("no-such-command",), 5, "a command from a later release")])
    assert [s.status for s in res.steps] == [UNAVAILABLE]
    assert res.exit_code == 0


def test_step_timeout_stops_the_step_and_its_ranks(tmp_path) -> None:  # type: ignore[no-untyped-def]
    token = str(tmp_path / "slow")
    step = Step("slow", ("gpu-test", "--timeout", "30", "--out-dir", token), 4, "too slow on purpose")
    t0 = time.monotonic()
    res = run_step(step)
    assert res.status == TIMEOUT and res.exit_code is None
    assert time.monotonic() - t0 < 30
    time.sleep(1)
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if any(token in c for c in p.info["cmdline"] or [])]
    assert not left
    assert judge([res], "h").exit_code == 4


def test_judge_exit_codes() -> None:
    def s(status: str) -> StepResult:
        return StepResult("x", "mldebug x", status, 0, 1.0, "why")

    assert judge([s(PASS), s(UNAVAILABLE)], "h").exit_code == 0
    assert judge([s(PASS), s("fail"), s(TIMEOUT)], "h").exit_code == 1
    assert judge([s(PASS), s("partial")], "h").exit_code == 4
    assert "not available" in judge([s(PASS), s(UNAVAILABLE)], "h").summary


def test_bad_skip_is_usage_error() -> None:
    r = mldebug("check", "--skip", "bogus", timeout=60)
    assert r.returncode == 2 and "hint:" in r.stderr
    assert set(checkup.registered_commands()) >= {"env", "gpu-test", "check"}
