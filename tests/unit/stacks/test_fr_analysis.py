"""The Flight Recorder cross-rank analysis (ml_debug.stacks.fr_analysis) on real captured dumps.

tests/golden/flight_recorder/fr-<r>.json: tests/jobs/fr_worker.py (rank 1 stops issuing after 3 all_reduces);
desync-<r>.json: `mldebug train --nproc-per-node 2 --inject desync@step=3,rank=1` with MLDEBUG_FR_DIR set
(rank 1's extra all_reduce of 7 floats is its collective #23, rank 0's is the next FSDP all-gather).
The live desync job, seen through dump-stacks and through watch's bundle, is in tests/cli/test_watch.py."""

from __future__ import annotations

import copy
import json
from typing import Any

from ml_debug.stacks import flight
from ml_debug.stacks.fr_analysis import analyse, compact
from tests.conftest import REPO

CAPTURED = REPO / "tests" / "golden" / "flight_recorder"


def _dump(name: str) -> dict[str, Any]:
    return flight.parse_dump((CAPTURED / name).read_bytes())


def _record(rank: int, dump: dict[str, Any], host: str = "h") -> dict[str, Any]:
    return {"rank": rank, "host": host, "pid": 100 + rank, "ok": True, "process_groups": flight.summarise_dump(dump),
            "collectives": compact(dump)}


def test_the_rank_that_never_issued_the_next_collective_is_named() -> None:
    a = analyse([_record(0, _dump("fr-0.json")), _record(1, _dump("fr-1.json"))])
    assert a is not None
    (pg,) = a["process_groups"]
    assert (pg["pg"], pg["desc"], pg["last_enqueued"], pg["last_completed"]) == (
        "0", "default_pg", {"rank 0": 4, "rank 1": 3}, {"rank 0": 3, "rank 1": 3})
    (missing,) = pg["not_enqueued"]
    assert (missing["seq"], missing["ranks"], missing["by"], missing["text"]) == (4, [1], [0], "gloo:all_reduce [[16]] Float")
    assert pg["mismatch"] is None
    assert pg["first_incomplete"]["seq"] == 4 and pg["first_incomplete"]["enqueued_by"] == "rank 0"
    assert a["findings"] == ["rank 1 never issued collective #4 of pg 0 (default_pg) (gloo:all_reduce [[16]] Float), "
                             "which rank 0 issued"]
    assert a["culprits"] == [{"rank": 1, "host": "h", "pid": 101, "why": "not-enqueued"}]


def test_a_desync_names_the_rank_that_issued_something_new_even_in_a_tie() -> None:
    records = [_record(0, _dump("desync-0.json")), _record(1, _dump("desync-1.json"))]
    a = analyse(records)
    assert a is not None
    m = a["process_groups"][0]["mismatch"]
    assert (m["seq"], m["kind"]) == (23, "op")
    odd, normal = m["sides"]
    assert (odd["ranks"], odd["op"], odd["input_sizes"], odd["odd"]) == ([1], "gloo:all_reduce", [[7]], True)
    assert (normal["ranks"], normal["op"], normal["odd"]) == ([0], "gloo:all_gather", False)
    assert a["findings"][0] == ("desync in collective #23 of pg 0 (default_pg): rank 1 issued gloo:all_reduce [[7]] "
                                "Float while rank 0 issued gloo:all_gather [[8192]] Float (op mismatch)")
    assert a["culprits"] == [{"rank": 1, "host": "h", "pid": 101, "why": "desync"}]
    # the same dumps the other way round: still rank 1 (rank 0's op is what every step issues)
    again = analyse(list(reversed(records)))
    assert again is not None and again["culprits"][0]["rank"] == 1
    # dump-stacks' section carries it, and its evidence says so although no rank is behind
    sec = flight.section(records)
    assert sec is not None and sec["behind"] == [] and sec["analysis"]["culprits"][0]["rank"] == 1
    assert sec["evidence"].startswith("flight recorder: desync in collective #23 of pg 0")


def _with_entry(dump: dict[str, Any], seq: int, **change: Any) -> dict[str, Any]:
    d = copy.deepcopy(dump)
    for e in d["entries"]:
        if e["collective_seq_id"] == seq:
            e.update(change)
    return d


def test_size_and_dtype_mismatches_and_the_majority_decides() -> None:
    base = _dump("fr-0.json")  # 4 all_reduces of 16 floats; the 4th not completed
    ranks = [_record(r, base) for r in range(4)]
    assert analyse(ranks)["process_groups"][0]["mismatch"] is None  # type: ignore[index]
    ranks[2] = _record(2, _with_entry(base, 2, input_sizes=[[32]], output_sizes=[[32]]))
    m = analyse(ranks)["process_groups"][0]["mismatch"]  # type: ignore[index]
    assert (m["seq"], m["kind"], [s["ranks"] for s in m["sides"] if s["odd"]]) == (2, "size", [[2]])
    ranks[2] = _record(2, _with_entry(base, 3, input_dtypes=["BFloat16"], output_dtypes=["BFloat16"]))
    m = analyse(ranks)["process_groups"][0]["mismatch"]  # type: ignore[index]
    assert (m["seq"], m["kind"], [s["ranks"] for s in m["sides"] if s["odd"]]) == (3, "dtype", [[2]])


def test_uneven_all_to_all_is_not_a_mismatch_and_one_rank_is_no_analysis() -> None:
    base = _dump("fr-0.json")
    a2a = [_with_entry(base, 2, profiling_name="gloo:all_to_all", input_sizes=[[n]], output_sizes=[[n]])
           for n in (8, 24)]
    a = analyse([_record(0, a2a[0]), _record(1, a2a[1])])
    assert a is not None and a["process_groups"][0]["mismatch"] is None
    assert analyse([_record(0, base)]) is None
    assert analyse([_record(0, base), {"rank": 1, "ok": False, "error": "x"}]) is None


def test_compact_keeps_the_last_entries_of_each_group_and_drops_point_to_point() -> None:
    d = _dump("desync-0.json")
    d["entries"].append({**d["entries"][0], "is_p2p": True, "collective_seq_id": 0, "p2p_seq_id": 1})
    (g,) = compact(d, keep=5)
    assert [e["seq"] for e in g["entries"]] == [19, 20, 21, 22, 23]
    assert (g["last_enqueued"], g["last_completed"], g["name"], g["desc"]) == (23, 22, "0", "default_pg")
    assert json.loads(json.dumps(g)) == g  # plain data: it travels in remote nodes' JSON
