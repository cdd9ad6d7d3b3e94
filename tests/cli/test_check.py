"""`mldebug check`: each step a real subprocess with --json and a timeout, one verdict."""

from __future__ import annotations

import json

import jsonschema

from ml_debug.cli.app import COMMANDS
from ml_debug.compose import check as checkup
from ml_debug.compose.check import PASS, SKIPPED, TIMEOUT, StepResult, StepStatus, judge
from tests.conftest import REPO, mldebug
from tests.fakes import faults

SCHEMA = json.loads((REPO / "ml_debug" / "schemas" / "check.json").read_text())


def _default_ranks() -> list[tuple[int, int, str]]:
    """(rank, local rank, device) of a default gpu-test here: one rank per GPU, else 2 CPU ranks."""
    import torch

    if torch.cuda.is_available():
        return [(r, r, f"cuda:{r}") for r in range(torch.cuda.device_count())]
    return [(0, 0, "cpu"), (1, 1, "cpu")]


def test_check_runs_env_alone_with_the_other_steps_skipped() -> None:
    # gpu-test passing inside check (and the default gpu-test world): the bench-fault test below.
    r = mldebug("check", "--json", "--skip", "gpu-test", "--skip", "health", "--skip", "allreduce-bench",
                timeout=200)
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    steps = {s["name"]: s for s in doc["result"]["steps"]}
    assert steps["env"]["status"] == PASS and steps["env"]["schema"] == "mldebug.env", steps["env"]
    assert [steps[name]["status"] for name in ("gpu-test", "health", "allreduce-bench")] == ["skipped"] * 3
    assert doc["result"]["summary"].startswith("1/1 steps passed on ")
    assert r.returncode == 0 and doc["result"]["ok"]


def test_every_step_is_a_command_of_this_build() -> None:
    assert {step.argv[0] for step in checkup.DEFAULT_STEPS} <= set(COMMANDS)


def test_judge_exit_codes() -> None:
    def s(status: StepStatus) -> StepResult:
        return StepResult("x", "mldebug x", status, 0, 1.0, "why")

    assert judge([s(PASS), s(SKIPPED)], "h").exit_code == 0
    assert judge([s(PASS), s(SKIPPED)], "h").summary == "1/1 steps passed on h"
    assert judge([s(PASS), s(StepStatus.FAIL), s(TIMEOUT)], "h").exit_code == 1
    assert judge([s(PASS), s(StepStatus.PARTIAL)], "h").exit_code == 4
    assert judge([s(PASS), s(StepStatus.FAIL), s(StepStatus.INTERRUPTED)], "h").exit_code == 130
    # a step that lacks an optional part: 3, under a failure, over a late step
    assert judge([s(PASS), s(StepStatus.MISSING), s(TIMEOUT)], "h").exit_code == 3
    assert judge([s(StepStatus.MISSING), s(StepStatus.FAIL)], "h").exit_code == 1


def test_bad_skip_is_usage_error() -> None:
    r = mldebug("check", "--skip", "bogus", timeout=60)
    assert r.returncode == 2 and "hint:" in r.stderr


def test_a_bench_fault_leaves_gpu_test_alone_and_shows_in_the_bench_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # One MLDEBUG_TEST_FAULT value reaches every step; each fault names the command it acts on.
    spec = "allreduce-bench.corrupt:rank=1,count=4"
    r = mldebug("check", "--json", "--skip", "env", "--skip", "health", "--out-dir", str(tmp_path),
                env=faults.env(spec), timeout=600)
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    steps = {s["name"]: s for s in doc["result"]["steps"]}
    assert steps["gpu-test"]["status"] == PASS, steps["gpu-test"]
    # check's gpu-test step is a default gpu-test (no --device/--nproc-per-node): the suite's check of the
    # default world, one rank per GPU, else 2 CPU ranks.
    want = _default_ranks()
    assert steps["gpu-test"]["summary"] == f"{len(want)}/{len(want)} ranks OK on 1 host"
    gpu_test = json.loads((tmp_path / "check.gpu-test.json").read_text())["result"]
    assert [(x["identity"]["rank"], x["identity"]["local_rank"], x["identity"]["device"]) for x in gpu_test["ranks"]] \
        == want
    assert all(s["status"] == "ok" for x in gpu_test["ranks"] for s in x["stages"])
    assert not any("TEST-ONLY" in w for w in gpu_test["warnings"])
    bench = steps["allreduce-bench"]
    assert bench["status"] == "fail" and "wrong element(s) on rank(s) 1" in bench["summary"], bench
    assert bench["summary"].endswith("[TEST-ONLY fault hook active]")
    assert json.loads((tmp_path / "check.allreduce-bench.json").read_text())["result"]["test_faults"] == spec
    assert r.returncode == 1 and not doc["result"]["ok"]


def test_the_table_and_the_summary_say_the_status_words() -> None:
    import io

    from rich.console import Console

    res = judge([StepResult("env", "mldebug env", PASS, 0, 1.0, "fine"),
                 StepResult("health", "mldebug health", StepStatus.FAIL, 1, 2.0, "bad disk")], "h")
    buf = io.StringIO()
    checkup.render(res, Console(file=buf, width=200))
    text = buf.getvalue()
    assert "health fail: bad disk" in res.summary
    assert " pass " in text and " fail " in text and "StepStatus" not in text
