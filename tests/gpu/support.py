"""What the gpu-marked tests share: is there a GPU here, may it be used, and small checks.

A machine without an NVIDIA GPU skips every gpu-marked test with NVML's reason (so CI, which has
no GPU, skips them even with MLDEBUG_REQUIRE_REAL=1). A machine WITH a GPU that torch cannot use
(a CPU-only torch build, CUDA_VISIBLE_DEVICES hiding every GPU) fails them under
MLDEBUG_REQUIRE_REAL=1, as benchmarks/gpu_session.sh runs them, and skips them elsewhere.

Nothing here imports torch or CUDA at import time: collecting the tests on a CPU machine costs
one NVML probe, and only when a test asks.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import warnings
from dataclasses import dataclass

import pytest

from tests.conftest import REPO, require


@dataclass(frozen=True)
class GpuProbe:
    """What NVML and torch see on this machine."""

    nvml_gpus: int  # GPUs NVML counts (0: none, or NVML unusable)
    nvml_reason: str  # NVML's sentence: "1 GPU(s)" or why there is none
    torch_gpus: int  # CUDA devices torch can use in this process
    torch_reason: str  # why torch cannot use them, or "" when it can


@functools.lru_cache(maxsize=1)
def probe() -> GpuProbe:
    """NVML first (cheap, no CUDA); torch only when NVML found a GPU."""
    from ml_debug.core.nvml import NvmlGateway

    gw = NvmlGateway()
    status = gw.open()
    try:
        count = int(gw.device_count()) if status.available else 0
    finally:
        gw.close()
    if not count:
        return GpuProbe(0, status.reason, 0, "no GPU")
    try:
        import torch
    except ImportError as e:
        return GpuProbe(count, status.reason, 0, f"torch is not installed ({e})")
    if not torch.cuda.is_available():
        build = torch.version.cuda or "none (a CPU-only build)"
        return GpuProbe(count, status.reason, 0,
                        f"torch {torch.__version__} cannot use the GPU (CUDA build: {build}; "
                        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})")
    return GpuProbe(count, status.reason, torch.cuda.device_count(), "")


def need_gpus(n: int = 1) -> int:
    """Skip without an NVIDIA GPU; fail (MLDEBUG_REQUIRE_REAL=1) or skip when torch cannot use it,
    or when fewer than ``n`` GPUs are visible. Returns how many CUDA devices torch sees."""
    p = probe()
    if p.nvml_gpus == 0:
        pytest.skip(f"no GPU for the gpu-marked tests: {p.nvml_reason}")
    require(p.torch_gpus > 0, f"a CUDA-enabled torch for the {p.nvml_gpus} GPU(s) NVML sees: {p.torch_reason}")
    if p.torch_gpus < n:
        pytest.skip(f"needs {n} GPUs, this machine has {p.torch_gpus}")
    return p.torch_gpus


def need_module(name: str, why: str) -> None:
    """Fail (MLDEBUG_REQUIRE_REAL=1) or skip when a Python module a GPU path needs is missing."""
    try:
        importlib.import_module(name)
    except ImportError as e:
        require(False, f"Python module {name} for {why} ({e})")


def check_schema(doc: dict, name: str) -> None:
    """Validate a command's JSON document against its pinned schema when jsonschema is installed
    (a bare GPU image may lack it: a warning, or a failure under MLDEBUG_REQUIRE_REAL=1); the schema
    name is checked either way."""
    assert doc.get("schema") == f"mldebug.{name}", doc.get("schema")
    try:
        import jsonschema
    except ImportError:
        if os.environ.get("MLDEBUG_REQUIRE_REAL") == "1":
            pytest.fail(f"jsonschema is not installed: the {name} document cannot be validated (MLDEBUG_REQUIRE_REAL=1)")
        warnings.warn(f"jsonschema is not installed: the {name} document was not validated", stacklevel=2)
        return
    schema = json.loads((REPO / "ml_debug" / "schemas" / f"{name}.json").read_text())
    jsonschema.validate(doc, schema)


def json_doc(stdout: str, stderr: str, name: str) -> dict:
    """The one JSON document a command printed (validated), with stderr in the failure message."""
    assert stdout.strip().startswith("{"), f"no JSON document on stdout; stderr:\n{stderr[-4000:]}"
    doc = json.loads(stdout)
    check_schema(doc, name)
    return doc


def repo_env(**extra: str) -> dict[str, str]:
    """Extra environment for a command under test: the repository importable (mldebug need not be
    installed on a GPU image), plus ``extra``."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, **extra}
