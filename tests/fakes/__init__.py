"""Test doubles the product loads only through ``MLDEBUG_TEST_HOOKS`` (ml_debug.core.testhooks).

``tests.fakes.faults`` injects faults into gpu-test and allreduce-bench ranks; ``tests.fakes.nvml``
stands in for pynvml where no GPU exists. A subprocess (the mldebug CLI, its ranks, a remote node)
can import them only with the repository root on PYTHONPATH: :func:`hooks_env` sets both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ml_debug.core.testhooks import ENV as HOOKS_ENV

REPO = Path(__file__).resolve().parents[2]


def pythonpath(environ: Mapping[str, str] | None = None) -> str:
    """PYTHONPATH with the repository root first, so ``import tests.fakes`` works from any cwd."""
    env = os.environ if environ is None else environ
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO)]
    return os.pathsep.join([str(REPO), *rest])


def hooks_env(module: str, variables: Mapping[str, str]) -> dict[str, str]:
    """Environment for a subprocess that loads hook ``module`` with its own ``variables``."""
    return {"PYTHONPATH": pythonpath(), HOOKS_ENV: module, **variables}
