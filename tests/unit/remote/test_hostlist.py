"""Hostlist expressions: expand, compress, errors (pure; the same cases against the real
`scontrol` are in tests/rig/test_hostlist_scontrol.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ml_debug.core.errors import UsageError
from ml_debug.remote.hostlist import compress_hostlist, expand_hostlist


@pytest.mark.parametrize("expr, names", [
    ("node[01-04,07],gpu-a", ["node01", "node02", "node03", "node04", "node07", "gpu-a"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("n[1-010]", [f"n{i}" for i in range(1, 11)]),  # the width of LO as written pads the range
    ("n[098-101]-ib", ["n098-ib", "n099-ib", "n100-ib", "n101-ib"]),  # Slurm 22.05 refuses this one
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    # three groups or more: the last group varies fastest, then the first, second, ... and the
    # one before the last varies slowest (the order scontrol show hostnames prints)
    ("[1-2][1-2][1-2]", ["111", "112", "211", "212", "121", "122", "221", "222"]),
    ("r[1-2]-n[01-02]-g[0-1]", ["r1-n01-g0", "r1-n01-g1", "r2-n01-g0", "r2-n01-g1",
                                "r1-n02-g0", "r1-n02-g1", "r2-n02-g0", "r2-n02-g1"]),
    ("[1-2][1-2][1-2][1-2]", ["1111", "1112", "2111", "2112", "1211", "1212", "2211", "2212",
                              "1121", "1122", "2121", "2122", "1221", "1222", "2221", "2222"]),
    ("a[3,1]b[2,1]c[1-2]d[5,4]", ["a3b2c1d5", "a3b2c1d4", "a1b2c1d5", "a1b2c1d4",
                                  "a3b1c1d5", "a3b1c1d4", "a1b1c1d5", "a1b1c1d4",
                                  "a3b2c2d5", "a3b2c2d4", "a1b2c2d5", "a1b2c2d4",
                                  "a3b1c2d5", "a3b1c2d4", "a1b1c2d5", "a1b1c2d4"]),
    ("a,b c", ["a", "b", "c"]),
    ("a,a", ["a", "a"]),  # repeats kept, as scontrol keeps them
    ("n[3,1]", ["n3", "n1"]),  # order as written
    ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
    ("n١,n٢", ["n١", "n٢"]),  # non-ASCII digits outside brackets are plain text, as in Slurm
])
def test_expand(expr: str, names: list[str]) -> None:
    assert expand_hostlist(expr) == names


def test_the_largest_range_slurm_takes() -> None:
    assert len(expand_hostlist("n[1-65536]")) == 65536
    assert len(expand_hostlist("n[1-1000]m[1-1000]")) == 1_000_000  # many names, no range too long


@pytest.mark.parametrize("expr, words", [
    ("", "empty hostlist"),
    ("n[1-", "never closed"),
    ("n]", "without '['"),
    ("n[a]", "not a number"),
    ("n[3-1]", "goes backwards"),
    ("n[[1]]", "nested"),
    ("n[]", "empty brackets"),
    ("n[0-65536]", "Too many hosts in range 0-65536"),
    ("n[1-2]m[5-99999999]", "Too many hosts in range 5-99999999"),
    ("n[1-3000]m[1-3000]", "more than"),
    ("n[١-٣]", "non-ASCII digit"),
    ("n[١,٢]", "non-ASCII digit"),
    ("n[1-٣]", "non-ASCII digit"),
    ("n[１]", "non-ASCII digit"),  # fullwidth digit one
])
def test_expand_errors_say_where(expr: str, words: str) -> None:
    with pytest.raises(UsageError) as e:
        expand_hostlist(expr)
    assert words in e.value.message
    assert e.value.exit_code == 2


def test_error_names_the_position() -> None:
    with pytest.raises(UsageError) as e:
        expand_hostlist("a,n[1,٣]")
    assert "at character 7" in e.value.message


@pytest.mark.parametrize("names, expr", [
    (["node01", "node02", "node03", "node07", "gpu-a"], "gpu-a,node[01-03,07]"),
    (["n9", "n10", "n8"], "n[8-10]"),
    (["n1", "n1"], "n1"),
    ([f"node{i:03d}" for i in range(1, 129)], "node[001-128]"),  # padding across 099 -> 100
    (["n08", "n09", "n10", "n11", "n12"], "n[08-12]"),  # 10-12 fit the width of 08
    (["n98", "n99", "n100"], "n[98-100]"),
    (["n099", "n100", "n1000"], "n[099-100,1000]"),  # 1000 is wider than 099: a new range
    (["n08", "n9", "n10"], "n[08,9-10]"),  # 08 and 9 differ in padding
    (["n007", "n7"], "n[7,007]"),  # padding is part of the name: different hosts, narrower first
    (["n١", "n٢"], "n١,n٢"),  # only ASCII digits are numbers
    (["n1-ib", "n2-ib"], "n1-ib,n2-ib"),  # a number must end the name
    (["r1n1", "r1n2", "r2n1"], "r1n[1-2],r2n1"),
    (["n", "n1", "n2"], "n,n[1-2]"),
])
def test_compress(names: list[str], expr: str) -> None:
    assert compress_hostlist(names) == expr
    assert sorted(set(expand_hostlist(expr))) == sorted(set(names))


names = st.lists(
    st.builds(lambda p, n, w, s: f"{p}{str(n).zfill(w)}{s}",
              st.sampled_from(["node", "gpu-", "a", "rack1-n", ""]), st.integers(0, 1200),
              st.integers(0, 4), st.sampled_from(["", "-ib", "x"]))
    | st.sampled_from(["login", "gpu-a", "head", "n١"]),
    min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(names)
def test_compress_then_expand_gives_the_same_set(hosts: list[str]) -> None:
    expanded = expand_hostlist(compress_hostlist(hosts))
    assert sorted(expanded) == sorted(set(hosts))  # each name once
