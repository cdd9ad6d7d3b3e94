"""Property tests: expand_hostlist and compress_hostlist agree with the real Slurm
(`scontrol show hostnames` / `scontrol show hostlist`, Slurm 22.05 on the rig).

scontrol only parses here (no slurmctld needed), but it must find a readable slurm.conf, or it
retries for a minute: a two-line one is enough. On bad input it prints its error on stderr and
still exits 0, so every call here checks stderr too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ml_debug.core.errors import UsageError
from ml_debug.remote.hostlist import compress_hostlist, expand_hostlist
from tests.conftest import require

pytestmark = pytest.mark.rig

Run = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture(scope="module")
def scontrol_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    exe = shutil.which("scontrol")
    require(exe, "scontrol (Slurm client tools)")
    assert exe is not None
    conf = tmp_path_factory.mktemp("slurmconf") / "slurm.conf"
    conf.write_text("ClusterName=hostlisttest\nSlurmctldHost=localhost\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, "show", *args], capture_output=True, text=True, timeout=60, env=env,
                              stdin=subprocess.DEVNULL)

    return run


@pytest.fixture(scope="module")
def scontrol(scontrol_run: Run) -> Callable[..., list[str]]:
    def run(*args: str) -> list[str]:
        proc = scontrol_run(*args)
        assert proc.returncode == 0 and not proc.stderr, proc.stderr
        return proc.stdout.split()

    return run


@st.composite
def ranges(draw: st.DrawFn, span: int) -> str:
    lo = draw(st.integers(0, 300))
    width = draw(st.integers(1, 4))
    lo_s = str(lo).zfill(width)
    if draw(st.booleans()):
        return lo_s
    hi = lo + draw(st.integers(0, span))
    return f"{lo_s}-{hi}"


@st.composite
def items(draw: st.DrawFn) -> str:
    text = st.text("abcxyz-.", min_size=0, max_size=4)
    # a leading "-" would make scontrol read the expression as an option
    prefix = (draw(st.sampled_from(["node", "gpu-", "n", "rack-a", ""])) + draw(text)).lstrip("-")
    groups = draw(st.integers(0, 4))
    # keep three or four groups small: their product is what scontrol prints
    span, per_group = (12, 3) if groups <= 2 else (3, 2)
    out = prefix
    for i in range(groups):
        out += "[" + ",".join(draw(st.lists(ranges(span), min_size=1, max_size=per_group))) + "]"
        # Slurm 22.05 takes text between groups but not after the last one (we take both).
        if i + 1 < groups:
            out += draw(st.sampled_from(["", "-ib", "x", "-r"]))
    return out or "login"


expressions = st.lists(items(), min_size=1, max_size=4).map(",".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(expressions)
def test_expand_matches_scontrol(scontrol, expr: str) -> None:
    assert expand_hostlist(expr) == scontrol("hostnames", expr)


number = st.integers(0, 30) | st.integers(90, 110) | st.integers(990, 1010) | st.integers(0, 1200)
host_names = st.lists(
    st.builds(lambda p, n, w: f"{p}{str(n).zfill(w)}",
              st.sampled_from(["node", "gpu-", "n", "rack1-n", "r01n", ""]), number, st.integers(0, 4))
    | st.sampled_from(["login", "gpu-a", "n1-ib", "n2-ib", "n", "n١"]),
    min_size=1, max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(host_names)
def test_compress_is_what_scontrol_writes(scontrol, names: list[str]) -> None:
    expr = compress_hostlist(names)
    # Slurm, given the hosts in the order our expression lists them, writes exactly our expression
    assert scontrol("hostlist", ",".join(expand_hostlist(expr))) == [expr]
    # and reads it back as the same set of names, each once
    assert sorted(scontrol("hostnames", expr)) == sorted(set(names))


@pytest.mark.parametrize("names", [
    [f"node{i:03d}" for i in range(1, 129)],
    ["n08", "n09", "n10", "n11", "n12"],
    ["n8", "n9", "n10"],
    ["n98", "n99", "n100"],
    ["n099", "n100", "n1000"],
    ["n0998", "n0999", "n1000", "n01001"],
    ["n08", "n9", "n10"],
    ["n7", "n007"],
    ["n0", "n00", "n000"],
    ["gpu-a", "login", "n١", "n٢"],
    ["r1n1", "r1n2", "r2n1"],
])
def test_compress_of_sorted_names_equals_scontrol(scontrol, names: list[str]) -> None:
    assert [compress_hostlist(names)] == scontrol("hostlist", ",".join(names))


@pytest.mark.parametrize("expr", [
    "[1-2][1-2][1-2]",
    "r[1-2]-n[01-02]-g[0-1]",
    "[1-2][1-2][1-2][1-2]",
    "a[1-3]b[1-2]c[1-2]",
    "a[3,1]b[2,1]c[1-2]d[5,4]",
    "[1-2][1-2][1-2][1-2][1-2]",
])
def test_three_or_more_groups_in_slurms_order(scontrol, expr: str) -> None:
    assert expand_hostlist(expr) == scontrol("hostnames", expr)


def test_range_limit_is_slurms(scontrol, scontrol_run: Run) -> None:
    assert expand_hostlist("n[1-65536]") == scontrol("hostnames", "n[1-65536]")
    for expr in ("n[0-65536]", "a[1-2]b[1-70000]", "a[1-70000]b[1-2]"):
        proc = scontrol_run("hostnames", expr)
        assert "Too many hosts in range" in proc.stderr and not proc.stdout
        with pytest.raises(UsageError, match="Too many hosts in range"):
            expand_hostlist(expr)


@pytest.mark.parametrize("expr", ["n[١-٣]", "n[١,٢]", "n[1-٣]"])
def test_non_ascii_digits_are_refused_like_slurm(scontrol_run: Run, expr: str) -> None:
    proc = scontrol_run("hostnames", expr)
    assert "Invalid range" in proc.stderr and not proc.stdout
    with pytest.raises(UsageError, match="non-ASCII digit"):
        expand_hostlist(expr)


def test_where_we_are_more_lenient_than_slurm(scontrol, scontrol_run: Run) -> None:
    # Text after the last group: Slurm 22.05 prints "Invalid hostlist"; we expand it.
    assert "Invalid hostlist" in scontrol_run("hostnames", "node[1-2]-ib").stderr
    assert expand_hostlist("node[1-2]-ib") == ["node1-ib", "node2-ib"]
    assert compress_hostlist(["node1-ib", "node2-ib"]) == "node1-ib,node2-ib"  # scontrol writes the same
    assert scontrol("hostlist", "node1-ib,node2-ib") == ["node1-ib,node2-ib"]
    # Spaces inside brackets: Slurm says "Invalid range"; we read the numbers.
    assert "Invalid range" in scontrol_run("hostnames", "n[ 1 - 2 ]").stderr
    assert expand_hostlist("n[ 1 - 2 ]") == ["n1", "n2"]


def test_where_we_differ_on_purpose(scontrol) -> None:
    # scontrol show hostlist keeps the input order and repeats; compress_hostlist sorts and
    # drops repeats (its callers show a set of hosts).
    assert scontrol("hostlist", "n3,n1,n2,n1") == ["n[3,1-2,1]"]
    assert compress_hostlist(["n3", "n1", "n2", "n1"]) == "n[1-3]"
