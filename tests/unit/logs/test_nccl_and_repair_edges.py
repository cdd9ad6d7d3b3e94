"""Paths of logs/nccl.py and logs/repair.py that real logs take but the kept samples do not (found by
coverage): NCCL's INFO version line, its collective transports, a docker interface, NCCL_NET, collectors of
two readers that saw one rank's host apart; numbers outside markdown quoting, a bar redrawn by ``\\r``."""

from __future__ import annotations

import pytest

from ml_debug.logs.nccl import NcclCollector, transport_family
from ml_debug.logs.repair import mend, mend_line, sniff
from tests.conftest import REPO


@pytest.mark.parametrize(("via", "family"), [
    ("P2P/IPC/read", "P2P"), ("direct pointer", "P2P"), ("NET/IB/3", "NET/IB"), ("NET/Socket/0", "NET/Socket"),
    ("SHM/direct/direct", "SHM"), ("direct shared memory", "SHM"), ("CollNet/0", "CollNet"),
    ("NVLS", "NVLS"), ("COLLNETDirect", "COLLNET"), ("PXN/x", "PXN")])
def test_transport_families(via: str, family: str) -> None:
    assert transport_family(via) == family


def test_info_version_line_docker_interface_and_nccl_net() -> None:
    c = NcclCollector()
    for line in ("h1:10:10 [0] NCCL INFO NCCL version 2.19.3+cuda12.3",
                 "h1:10:10 [0] NCCL INFO NCCL_NET set by environment to Socket",
                 "h1:10:10 [0] NCCL INFO NET/Socket : Using [0]docker0:172.17.0.1<0>",
                 "h1:10:11 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0"):
        assert c.feed(line, 0) is not None
    n = c.report()
    assert n is not None and n["versions"] == {"2.19.3+cuda12.3": 1}
    texts = {f["code"]: f["text"] for f in n["findings"]}
    assert "(NCCL_NET=Socket)" in texts["socket-not-ib"]
    assert texts["bad-interface"].startswith("h1: NCCL uses a loopback, docker or virtual interface (docker0)")


def test_a_host_a_comm_line_said_outranks_one_a_channel_line_suggested() -> None:
    first, later = NcclCollector(), NcclCollector()
    first.feed("h9:10:10 [0] NCCL INFO Channel 00/0 : 3[0] -> 1[0] via P2P/IPC", None)
    later.feed("h1:30:30 [0] NCCL INFO comm 0x1 rank 3 nRanks 4 nNodes 1 localRanks 4 localRank 3", None)
    later.feed("h2:40:40 [0] NCCL INFO Channel 00/0 : 2[0] -> 1[0] via P2P/IPC", None)
    first.feed("h5:50:50 [0] NCCL INFO Channel 01/0 : 2[0] -> 0[0] via P2P/IPC", None)
    first.absorb(later)
    assert first.rank_host == {3: "h1", 2: "h5"}


def test_numbers_outside_markdown_quoting_are_both_removed() -> None:
    text = "".join(f"{i:>4} | > line {i} of the log\n" for i in range(1, 9)).encode()
    d = sniff(text)
    assert d.numbered and d.quoted
    assert mend(text, d).decode().splitlines()[0] == "line 1 of the log"


def test_a_bar_redrawn_in_place_is_no_damage_but_two_lines_are() -> None:
    assert mend_line("step 1\rstep 2") == (["step 1", "step 2"], "carriage return")
    assert sniff(b"\n\n  \n").whole is False


def test_lines_of_one_format_at_the_widest_are_not_hard_wrapped() -> None:
    """gloo's retry lines ("[.../debug_logger.cc:9] ERROR failed to connect, willRetry=1, retry=1, ...") come out at one
    width, the log's widest, one after another: each next line starts as the line itself did, so none is a wrapped
    line's rest. (tests/data/logs/catalogue/restart-failed.log: before, its traceback took in a rank's next line.)"""
    text = (REPO / "tests" / "data" / "logs" / "catalogue" / "restart-failed.log").read_bytes()
    assert sniff(text).wrap_width is None
