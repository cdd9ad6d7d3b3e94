"""Shared test helpers.

Real parts (torchrun, py-spy, gdb, sshd, Slurm) are required: when one is missing a test
FAILS if MLDEBUG_REQUIRE_REAL=1 (as in CI, set by tests/run.sh) and skips otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["tests.rig.fixtures"]

REPO = Path(__file__).resolve().parents[1]
REQUIRE_REAL = os.environ.get("MLDEBUG_REQUIRE_REAL") == "1"


def require(condition: object, what: str) -> None:
    """Fail (CI) or skip (a laptop) when a real part is missing."""
    if not condition:
        if REQUIRE_REAL:
            pytest.fail(f"required real part missing: {what}")
        pytest.skip(f"real part missing: {what}")


def mldebug(*args: str, timeout: float = 300, env: dict[str, str] | None = None,
            cwd: str | Path | None = None, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real `mldebug` CLI in a subprocess (python -m ml_debug) and capture its output."""
    full_env = {**os.environ, "MLDEBUG_WIDTH": "160", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "ml_debug", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd, input=input)


@pytest.fixture
def run_mldebug():
    return mldebug


def validate_schema(doc: dict, name: str) -> None:
    """Validate a command's JSON document against its pinned schema in ml_debug/schemas/."""
    import json

    import jsonschema

    schema = json.loads((REPO / "ml_debug" / "schemas" / f"{name}.json").read_text())
    jsonschema.validate(doc, schema)
