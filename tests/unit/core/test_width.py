"""Table width from MLDEBUG_WIDTH/COLUMNS: a positive number sets it, 0 or garbage is ignored."""

from __future__ import annotations

import os

import pytest

from ml_debug.core.output import UNLIMITED, _width
from tests.conftest import mldebug


@pytest.mark.parametrize(("mldebug_width", "columns", "width"), [
    ("0", "", UNLIMITED), ("", "0", UNLIMITED), ("abc", "", UNLIMITED), ("-5", "", UNLIMITED), ("²", "", UNLIMITED),
    ("0", "90", 90), ("72", "0", 72), (" 100 ", "", 100),
])
def test_a_width_is_a_positive_number_else_the_normal_rule(mldebug_width: str, columns: str, width: int,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLDEBUG_WIDTH", mldebug_width)
    monkeypatch.setenv("COLUMNS", columns)
    read, write = os.pipe()  # a pipe, not a terminal: the normal rule gives it every column
    with os.fdopen(read) as _, os.fdopen(write, "w") as stream:
        assert _width(stream) == width


@pytest.mark.parametrize("variable", ["MLDEBUG_WIDTH", "COLUMNS"])
def test_a_width_of_0_still_prints_the_table(variable: str) -> None:
    r = mldebug("health", "--brief", env={"MLDEBUG_WIDTH": "", "COLUMNS": "", variable: "0"}, timeout=120)
    assert r.returncode in (0, 1), r.stderr
    assert "health" in r.stdout.lower() and len(r.stdout.splitlines()) >= 2, (r.stdout, r.stderr)
