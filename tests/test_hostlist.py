"""Hostlist expressions: expand, compress, errors (pure; the scontrol comparison is in
tests/test_hostlist_scontrol.py)."""

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
    ("n[098-101]-ib", ["n098-ib", "n099-ib", "n100-ib", "n101-ib"]),  # Slurm 22.05 refuses this one
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("a,b c", ["a", "b", "c"]),
    ("a,a", ["a", "a"]),  # repeats kept, as scontrol keeps them
    ("n[3,1]", ["n3", "n1"]),  # order as written
    ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
])
def test_expand(expr: str, names: list[str]) -> None:
    assert expand_hostlist(expr) == names


@pytest.mark.parametrize("expr, words", [
    ("", "empty hostlist"),
    ("n[1-", "never closed"),
    ("n]", "without '['"),
    ("n[a]", "not a number"),
    ("n[3-1]", "goes backwards"),
    ("n[[1]]", "nested"),
    ("n[]", "empty brackets"),
    ("n[1-99999999]", "more than"),
    ("n[1-3000]m[1-3000]", "more than"),
])
def test_expand_errors_say_where(expr: str, words: str) -> None:
    with pytest.raises(UsageError) as e:
        expand_hostlist(expr)
    assert words in e.value.message
    assert e.value.exit_code == 2


def test_compress() -> None:
    assert compress_hostlist(["node01", "node02", "node03", "node07", "gpu-a"]) == "gpu-a,node[01-03,07]"
    assert compress_hostlist(["n9", "n10", "n8"]) == "n[8-10]"
    assert compress_hostlist(["n1", "n1"]) == "n1"
    # padding is part of the name: 007 and 7 are different hosts
    assert sorted(expand_hostlist(compress_hostlist(["n007", "n7"]))) == ["n007", "n7"]


names = st.lists(
    st.builds(lambda p, n, w, s: f"{p}{str(n).zfill(w)}{s}",
              st.sampled_from(["node", "gpu-", "a", "rack1-n"]), st.integers(0, 1200),
              st.integers(0, 4), st.sampled_from(["", "-ib", "x"]))
    | st.sampled_from(["login", "gpu-a", "head"]),
    min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(names)
def test_compress_then_expand_gives_the_same_set(hosts: list[str]) -> None:
    assert sorted(set(expand_hostlist(compress_hostlist(hosts)))) == sorted(set(hosts))
