"""The node sample's fast readers (sampling/sample.py): for every input the fast path and the checked reader
give the same sample or the same refusal,"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from ml_debug.sampling.sample import GpuSample, ProgressFile, RankSample, SampleError
from tests.conftest import REPO

GOLDEN = REPO / "tests" / "golden" / "top-sample.json"

# values of every kind a field may be sent with: plain, None, a bool, a subclass, a wrong type, lists
ODD: list[Any] = [None, 0, 7, -3, 2.5, 100, True, False, "x", "", [], [1], [1, 2], ["a"], [True], [1.0], {}, {"a": 1},
                  1 << 70, float("nan")]


class MyInt(int):
    pass


def _same(read: Any, checked: Any, d: dict[str, Any]) -> None:
    """`read(d)` and `checked(d)`: equal samples (same types too) or the same refusal."""
    try:
        want: Any = checked(d)
    except SampleError as e:
        with pytest.raises(SampleError) as got:
            read(d)
        assert str(got.value) == str(e)
        return
    assert repr(read(d)) == repr(want)  # the same fields, of the same types (NaN is unequal to itself)


def test_the_fast_readers_agree_with_the_checked_ones_on_every_kind_of_value() -> None:
    golden = json.loads(GOLDEN.read_text())
    bases: list[tuple[Any, Any, dict[str, Any]]] = [
        (GpuSample.from_json, GpuSample._checked, golden["gpus"][0]),
        (RankSample.from_json, RankSample._checked, golden["ranks"][0]),
        (RankSample.from_json, RankSample._checked, golden["ranks"][1]),
        (ProgressFile.from_json, ProgressFile._checked, golden["progress"][0]),
        (ProgressFile.from_json, ProgressFile._checked, golden["ranks"][0]["progress"]),
    ]
    rnd = random.Random(30)
    tried = 0
    for read, checked, base in bases:
        _same(read, checked, base)
        for key in base:
            for value in [*ODD, MyInt(3)]:
                _same(read, checked, {**base, key: value})
                tried += 1
            _same(read, checked, {k: v for k, v in base.items() if k != key})  # the key missing
        _same(read, checked, {**base, "new_field": 1})
        for _ in range(200):  # several fields at once
            d = dict(base)
            for key in rnd.sample(list(base), 3):
                d[key] = rnd.choice(ODD)
            _same(read, checked, d)
    assert tried > 400


def test_a_rank_reads_its_own_progress_file_as_its_own_on_both_paths() -> None:
    golden = json.loads(GOLDEN.read_text())
    rank = {**golden["ranks"][0], "rank": 5, "progress": {**golden["ranks"][0]["progress"], "rank": 3}}
    fast, checked = RankSample.from_json(rank), RankSample._checked(rank)
    assert fast == checked and fast.progress is not None and fast.progress.rank == 5
    assert fast.gpu is not rank["gpu"]  # the sample holds its own lists, not the document's


def test_a_dict_subclass_is_read_by_the_checked_reader() -> None:
    from collections import defaultdict

    golden = json.loads(GOLDEN.read_text())
    gpu: defaultdict[str, Any] = defaultdict(lambda: 1, golden["gpus"][0])
    del gpu["name"]  # the fast path's lookup would have made it 1
    assert GpuSample.from_json(gpu) == GpuSample._checked(gpu) and GpuSample.from_json(gpu).name is None
