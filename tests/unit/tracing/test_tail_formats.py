"""trace-tail compares trace files written in either line format (nicer, or the seed's)."""

from __future__ import annotations

import pytest

from ml_debug.tracing.tail import _elapsed, normalise


@pytest.mark.parametrize("line, body, seconds", [
    ("0:00:01.250000 x.py:3: y = 1", "x.py:3: y = 1", 1.25),
    ("0:00:01.250000 [pid 7] x.py:3: y = 1", "x.py:3: y = 1", 1.25),
    ("1:02:03 train.py:    41:     loss = step(batch)", "train.py:    41:     loss = step(batch)", 3723.0),
    ("12345 0:00:03 train.py:    41:     loss = step(batch)", "train.py:    41:     loss = step(batch)", 3.0),
    ("12345  /home/me/proj/train.py:40 main", " /home/me/proj/train.py:40 main", None),
    (" /home/me/proj/train.py:40 main", " /home/me/proj/train.py:40 main", None),
])
def test_stamps_and_pids_of_both_formats_are_ignored(line: str, body: str, seconds: float | None) -> None:
    assert normalise(line) == body.rstrip()
    assert _elapsed(line) == seconds
