"""`mldebug check` end to end on a GPU node, with the CUDA torch installed there: every step passes
on NCCL (env, gpu-test, health, allreduce-bench) and none ends in an internal error. Marked gpu.

    pytest -m gpu tests/gpu/test_check.py
"""

from __future__ import annotations

import pytest

from tests.conftest import mldebug
from tests.gpu.support import json_doc, need_gpus, repo_env

pytestmark = pytest.mark.gpu


def test_check_passes_every_step_on_a_gpu_node() -> None:
    need_gpus(1)
    proc = mldebug("check", "--json", timeout=420, env=repo_env())
    doc = json_doc(proc.stdout, proc.stderr, "check")
    result = doc["result"]
    steps = {s["name"]: s for s in result["steps"]}
    assert {"env", "gpu-test", "health", "allreduce-bench"} <= set(steps), sorted(steps)
    for name, step in steps.items():
        assert "internal error" not in step["summary"], (name, step)
    assert proc.returncode == 0 and result["ok"], ({n: (s["status"], s["summary"]) for n, s in steps.items()},
                                                   proc.stderr[-3000:])
    assert "nccl" in steps["gpu-test"]["summary"].lower() or steps["gpu-test"]["status"] == "pass", steps["gpu-test"]
