"""The benchmarks import what the package has: a name a refactor removed fails here, not on the day someone runs
the benchmark (benchmarks/bench_scale.py once imported a logs function that had been inlined).

The scripts import mldebug inside their functions (each part runs in a fresh process), so importing a script
proves nothing: every ``from ml_debug... import name`` in its source is resolved instead."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPTS = sorted((REPO / "benchmarks").glob("*.py"))


def _imports(path: Path) -> list[tuple[str, str, int]]:
    """(module, name, line) of every ``from ml_debug... import name`` in ``path``, at any depth."""
    return [(node.module, alias.name, node.lineno) for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ml_debug"
            for alias in node.names]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_name_a_benchmark_imports_from_mldebug_exists(script: Path) -> None:
    missing = []
    for module, name, line in _imports(script):
        mod = importlib.import_module(module)
        if not hasattr(mod, name):
            try:  # a submodule: `from ml_debug.logs import triage`
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{script.name}:{line}: {module}.{name}")
    assert not missing, missing


def test_the_benchmarks_import_from_mldebug() -> None:
    """The check above reads something: the benchmarks do import from the package."""
    assert sum(len(_imports(s)) for s in SCRIPTS) > 20
