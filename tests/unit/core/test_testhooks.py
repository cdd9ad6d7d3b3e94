"""The one test-hook gateway (ml_debug.core.testhooks): nothing from tests/ enters the product
unless MLDEBUG_TEST_HOOKS names it, and then only what it names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ml_debug.core import testhooks
from tests.conftest import REPO, mldebug
from tests.fakes import faults, pythonpath
from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import healthy_gpu

# Every hook point the product has, called as the product calls it, then what got imported.
PROBE = """
import json, sys
from ml_debug.core import nvml, testhooks
from ml_debug.core.environment import gpu_inventory
inv = gpu_inventory()
contexts = {
    testhooks.GPU_TEST_STAGE_START: dict(rank=0, device=0, stage="init"),
    testhooks.GPU_TEST_CONTRIBUTION: dict(rank=0, device=0, value=1.0),
    testhooks.BENCH_TIMED_REGION: dict(rank=0, collective="all_reduce", size=1, elapsed_s=lambda: 0.0),
    testhooks.BENCH_VERIFY_RESULT: dict(rank=0, collective="all_reduce", result=None, expected=None),
    testhooks.BENCH_PAIR_EXCHANGE: dict(rank=0, pair=(0, 1), elapsed_s=lambda: 0.0),
    testhooks.LOGS_VERDICT: dict(verdict=None),
    testhooks.LOGS_READER_SHARE: dict(share=0),
    testhooks.CHILD_STARTED: dict(pid=0, argv=["true"]),
    testhooks.TRAIN_SAVE_SWITCH_DONE: dict(rank=0),
}
assert set(contexts) | {testhooks.NVML_BACKEND} == set(testhooks.POINTS)
for point, context in contexts.items():
    assert testhooks.call(point, **context) is None
print(json.dumps({"source": inv.get("nvml_source"), "notes": testhooks.describe("allreduce-bench"),
                  "tests": sorted(m for m in sys.modules if m == "tests" or m.startswith("tests."))}))
"""


def _probe(env: dict[str, str]) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in (testhooks.ENV, faults.ENV, fake_nvml.ENV)}
    # The repository root is importable here, so only the gateway decides what gets imported.
    full = {**base, "PYTHONPATH": pythonpath(base), **env}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=full,
                         cwd="/tmp")
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def _scenario(tmp_path: Path) -> Path:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps({"gpus": [healthy_gpu(0)]}))
    return path


def test_unset_means_no_test_code_and_the_real_gateway(tmp_path: Path) -> None:
    # A fault spec and a scenario alone do nothing: only MLDEBUG_TEST_HOOKS opens the gateway.
    got = _probe({faults.ENV: "allreduce-bench.corrupt:rank=0", fake_nvml.ENV: str(_scenario(tmp_path))})
    assert got == {"source": "pynvml", "notes": None, "tests": []}


def test_only_the_named_module_is_imported(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path)
    got = _probe(fake_nvml.env(scenario))
    assert got == {"source": f"fake:{scenario}", "notes": None, "tests": ["tests", "tests.fakes", "tests.fakes.nvml"]}
    both = _probe({**fake_nvml.env(scenario), testhooks.ENV: "tests.fakes.nvml,tests.fakes.faults",
                   faults.ENV: "gpu-test.die:rank=5;allreduce-bench.slow:rank=3,factor=2"})
    assert both["source"] == f"fake:{scenario}" and "tests.fakes.faults" in both["tests"]
    assert both["notes"] == "allreduce-bench.slow:rank=3,factor=2"  # only this command's faults


def test_a_hook_module_that_does_not_import_is_a_usage_error() -> None:
    r = mldebug("env", "--no-torch", "--json", env={testhooks.ENV: "tests.fakes.no_such_module"}, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("mldebug: error:") == 1 and "MLDEBUG_TEST_HOOKS" in r.stderr and "hint:" in r.stderr


def test_call_describe_and_note_semantics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, body in (("hooks_a", "def gpu_test_contribution(rank, device, value):\n    return value + 1\n"
                                   "def describe(command):\n    return 'a' if command == 'gpu-test' else None\n"),
                       ("hooks_b", "def gpu_test_contribution(rank, device, value):\n    return None\n"
                                   "def describe(command):\n    return 'b'\n")):
        (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(testhooks.ENV, raising=False)
    assert not testhooks.active() and testhooks.call(testhooks.GPU_TEST_CONTRIBUTION, rank=0, device=0, value=1.0) is None
    assert testhooks.note("gpu-test") is None
    monkeypatch.setenv(testhooks.ENV, "hooks_a, hooks_b")
    # hooks_b answers None, so hooks_a's answer stands; a point no module defines answers None.
    assert testhooks.call(testhooks.GPU_TEST_CONTRIBUTION, rank=0, device=0, value=1.0) == 2.0
    assert testhooks.call(testhooks.BENCH_TIMED_REGION, rank=0, collective="x", size=1, elapsed_s=float) is None
    assert testhooks.describe("gpu-test") == "a; b" and testhooks.describe("allreduce-bench") == "b"
    assert testhooks.note("gpu-test") == "TEST-ONLY hooks active (MLDEBUG_TEST_HOOKS=hooks_a, hooks_b): a; b"


def test_fault_grammar_names_its_command() -> None:
    spec = "gpu-test.die:rank=1,stage=broadcast; allreduce-bench.corrupt:rank=1,count=4;gpu-test.wrong-value"
    die, corrupt, wrong = faults.parse(spec)
    assert [(f.command, f.kind) for f in (die, corrupt, wrong)] == [
        ("gpu-test", "die"), ("allreduce-bench", "corrupt"), ("gpu-test", "wrong-value")]
    assert wrong.applies(0) and wrong.applies(7, 3)  # no rank, no device: every rank
    assert corrupt.text == "allreduce-bench.corrupt:rank=1,count=4"
    assert faults.env("gpu-test.hang:rank=0") == {"PYTHONPATH": pythonpath(), testhooks.ENV: "tests.fakes.faults",
                                                  faults.ENV: "gpu-test.hang:rank=0"}
    assert pythonpath().split(os.pathsep)[0] == str(REPO)
