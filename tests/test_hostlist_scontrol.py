"""Property test: expand_hostlist agrees with the real `scontrol show hostnames`.

scontrol only parses here (no slurmctld needed), but it must find a readable slurm.conf, or it
retries for a minute: a two-line one is enough (FIELD-NOTES).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ml_debug.remote.hostlist import compress_hostlist, expand_hostlist
from tests.conftest import require

pytestmark = pytest.mark.rig


@pytest.fixture(scope="module")
def scontrol(tmp_path_factory: pytest.TempPathFactory):
    exe = shutil.which("scontrol")
    require(exe, "scontrol (Slurm client tools)")
    conf = tmp_path_factory.mktemp("slurmconf") / "slurm.conf"
    conf.write_text("ClusterName=hostlisttest\nSlurmctldHost=localhost\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}

    def run(*args: str) -> list[str]:
        proc = subprocess.run([exe, "show", *args], capture_output=True, text=True, timeout=20, env=env,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    return run


@st.composite
def ranges(draw: st.DrawFn) -> str:
    lo = draw(st.integers(0, 300))
    width = draw(st.integers(1, 4))
    lo_s = str(lo).zfill(width)
    if draw(st.booleans()):
        return lo_s
    hi = lo + draw(st.integers(0, 12))
    return f"{lo_s}-{hi}"


@st.composite
def items(draw: st.DrawFn) -> str:
    text = st.text("abcxyz-.", min_size=0, max_size=4)
    prefix = draw(st.sampled_from(["node", "gpu-", "n", "rack-a"])) + draw(text)
    groups = draw(st.integers(0, 2))
    out = prefix
    for i in range(groups):
        out += "[" + ",".join(draw(st.lists(ranges(), min_size=1, max_size=3))) + "]"
        # Slurm 22.05 takes text between groups but not after the last one (we take both).
        if i + 1 < groups:
            out += draw(st.sampled_from(["", "-ib", "x", "-r"]))
    return out


expressions = st.lists(items(), min_size=1, max_size=4).map(",".join)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(expressions)
def test_expand_matches_scontrol(scontrol, expr: str) -> None:
    assert expand_hostlist(expr) == scontrol("hostnames", expr)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(expressions)
def test_compress_names_what_scontrol_expands(scontrol, expr: str) -> None:
    names = expand_hostlist(expr)
    assert sorted(set(scontrol("hostnames", compress_hostlist(names)))) == sorted(set(names))


def test_where_we_are_more_lenient_than_slurm(scontrol) -> None:
    # Text after the last group: Slurm 22.05 prints "Invalid hostlist"; we expand it.
    assert expand_hostlist("node[1-2]-ib") == ["node1-ib", "node2-ib"]
    assert compress_hostlist(["node1-ib", "node2-ib"]) == "node1-ib,node2-ib"  # scontrol writes the same
    assert scontrol("hostlist", "node1-ib,node2-ib") == ["node1-ib,node2-ib"]
