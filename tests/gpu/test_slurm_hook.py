"""The Slurm health hook's NVML path on real GPUs (the rig tests drive it with the NVML fake).

Run on a GPU node:  pytest -m gpu tests/gpu/test_slurm_hook.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import mldebug
from tests.gpu.support import check_schema, probe, repo_env

pytestmark = pytest.mark.gpu


def test_hook_reads_the_real_gpus_and_decides_without_acting(tmp_path: Path) -> None:
    p = probe()
    if p.nvml_gpus == 0:
        pytest.skip(f"no GPU for the gpu-marked tests: {p.nvml_reason}")
    # --dry-run without scontrol on PATH: the node's state is not read, nothing is changed
    proc = mldebug("--json", "health", "--slurm-check", "--dry-run", "--node", "gpunode", "--history",
                   str(tmp_path / "h" / "history.db"),
                   env=repo_env(PATH=str(Path(sys.executable).parent), MLDEBUG_TEST_HOOKS=""))
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    check_schema(doc, "slurm-check")
    r = doc["result"]
    assert r["gpus"] == p.nvml_gpus and not r["nvml"].startswith("fake")
    assert r["state_before"] is None and any("not read" in n for n in r["notes"])
    if r["ok"]:
        assert (r["action"], r["reason"], proc.returncode) == ("none", None, 0)
    else:  # a real failing GPU here: the reason names it
        assert r["action"] == "drain" and r["reason"].startswith("mldebug: ") and proc.returncode == 1
