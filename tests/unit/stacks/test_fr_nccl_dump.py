"""A real NCCL Flight Recorder dump (written on an H200 by tests/gpu/test_fr_nccl_files.py; provenance in
tests/data/flight_recorder/nccl-h200/README.md) read on a CPU machine by the restricted unpickler, as the
post-mortem and dump-stacks paths read it: groups, sequence numbers and states as NCCL writes them."""

from __future__ import annotations

from ml_debug.stacks.flight import parse_dump, summarise_dump
from ml_debug.stacks.fr_analysis import compact
from tests.conftest import REPO

DUMP = REPO / "tests/data/flight_recorder/nccl-h200/nccl_trace_rank_0"


def test_the_real_nccl_pickle_is_read_with_plain_data_only() -> None:
    dump = parse_dump(DUMP.read_bytes())
    assert dump["version"] == "2.10" and set(dump["pg_status"]) == {"0", "1"}
    assert [e["profiling_name"] for e in dump["entries"]][3:6] == ["nccl:broadcast", "nccl:_all_gather_base",
                                                                   "nccl:_reduce_scatter_base"]


def test_the_last_enqueued_all_reduce_is_still_scheduled_behind_the_spin_kernel() -> None:
    pgs = {p["pg_id"]: p for p in summarise_dump(parse_dump(DUMP.read_bytes()))}
    assert (pgs["0"]["last_completed_seq"], pgs["0"]["last_enqueued_seq"]) == (6, 7)
    assert pgs["0"]["last_enqueued"]["op"] == "nccl:all_reduce" and pgs["0"]["last_enqueued"]["state"] == "scheduled"
    assert pgs["0"]["last_completed"]["op"] == "nccl:_reduce_scatter_base"
    assert (pgs["1"]["last_completed_seq"], pgs["1"]["last_enqueued_seq"]) == (1, 1)


def test_compact_keeps_each_groups_collectives_in_order_with_int_pg_ids_read_as_text() -> None:
    groups = {g["pg_id"]: g for g in compact(parse_dump(DUMP.read_bytes()))}
    assert set(groups) == {"0", "1"}
    assert [e["seq"] for e in groups["0"]["entries"]] == [1, 2, 3, 4, 5, 6, 7]
    assert groups["0"]["entries"][-1]["state"] == "scheduled" and groups["0"]["name"] == "0"
    assert groups["1"]["desc"] == "undefined"
