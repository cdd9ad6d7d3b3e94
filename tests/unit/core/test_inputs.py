"""What a command reads and starts is bounded, and says so: a hostfile's size, one log source's bytes, the
ranks a node can run (with an override)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from ml_debug.core.errors import UsageError
from ml_debug.dist.limits import check_nproc, node_limit
from ml_debug.logs.scan import Capped
from ml_debug.logs.sources import Source
from ml_debug.remote.targets import MAX_HOSTFILE_BYTES, parse_hostfile


def test_a_hostfile_over_the_cap_is_refused_with_its_size_and_the_cap(tmp_path: Path) -> None:
    big = tmp_path / "hosts.txt"
    with open(big, "wb") as fh:  # sparse: no disk, and a reader that read it all would hold 9 MiB
        fh.truncate(MAX_HOSTFILE_BYTES + (1 << 20))
    with pytest.raises(UsageError, match=r"holds 9 MiB, more than a hostfile may hold \(8 MiB\)"):
        parse_hostfile(big)


def test_a_hostfile_that_is_not_text_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "hosts.txt"
    bad.write_bytes(b"node1\n\xff\xfe\n")
    with pytest.raises(UsageError, match="is not text"):
        parse_hostfile(bad)


def test_one_log_source_is_read_up_to_its_cap_and_says_it_was_cut() -> None:
    src = Source("-", "console", stdin=True)
    capped = Capped(io.BytesIO(b"x" * 100), src, limit=40)
    assert len(capped.read()) == 40 and capped.read(10) == b""
    assert src.cut is not None and "the most one source may hold" in src.cut
    whole = Source("-", "console", stdin=True)
    assert Capped(io.BytesIO(b"y" * 40), whole, limit=40).read() == b"y" * 40 and whole.cut is None


def test_rank_counts_above_the_node_limit_are_refused_unless_raised() -> None:
    limit, why = node_limit()
    assert limit >= (os.cpu_count() or 1) and why
    check_nproc(limit)
    with pytest.raises(UsageError, match=f"at most {limit}"):
        check_nproc(limit + 1)
    check_nproc(limit + 1, override=limit + 1)  # --max-nproc-per-node
    with pytest.raises(UsageError, match=r"--nproc-per-node 3 is more ranks .*\(at most 2: --max-nproc-per-node\)"):
        check_nproc(3, override=2)
