"""The cross-rank analyses on a synthetic 4,096-rank job (512 nodes of 8) with known odd ranks.

The job is benchmarks/bench_scale.py's (the benchmark times the same inputs at 1k/4k/16k): a 3D
layout of TP 8 within a node, PP 4 and DP 128, 64 collectives kept per TP and DP group and rank.
Here each analysis must name the planted rank; timings live in the benchmark, not here."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks import bench_scale as job
from ml_debug.core.ranges import compress, expand
from ml_debug.remote.hostlist import compress_hostlist, expand_hostlist
from ml_debug.stacks import flight
from ml_debug.stacks.fr_analysis import analyse as fr_analyse
from ml_debug.stacks.merge import Member, analyse
from ml_debug.stacks.result import dump_from_json

N = 4096
ODD = job.culprits(N)


@pytest.fixture(scope="module", autouse=True)
def _collector_paused() -> Iterator[None]:
    """Millions of new containers and no cyclic garbage among them: the cyclic collector would only walk
    them, the more often the bigger the heap (the 4k records: 3.9 s against 0.45 s in a process that has
    imported torch, as an xdist worker has)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture(scope="module")
def fr_records() -> list[dict[str, Any]]:
    return [job.fr_record(rank, N) for rank in range(N)]


def test_flight_recorder_analysis_of_a_4k_rank_hang_names_the_rank_that_never_issued_the_last_all_reduce(
        fr_records: list[dict[str, Any]]) -> None:
    a = fr_analyse(fr_records)
    assert a is not None
    lagging, desync = ODD["not_enqueued"], ODD["desync"]
    tp = job.group_names(lagging, N)["mesh_tp"]
    peers = [r for r in range(lagging // 8 * 8, lagging // 8 * 8 + 8) if r != lagging]
    (group,) = [g for g in a["process_groups"] if g["pg"] == tp]
    (missing,) = group["not_enqueued"]
    assert (missing["seq"], missing["ranks"], missing["by"]) == (job.STEPS, [lagging], peers)
    assert f"rank {lagging} never issued collective #{job.STEPS} of pg {tp} (mesh_tp) " \
           f"(nccl:all_reduce [[4096,8192]] BFloat16), which ranks {compress(peers)} issued" in a["findings"]
    # the desync comes first: one DP rank's gradient bucket of another size, 127 ranks agree
    dp = job.group_names(desync, N)["mesh_dp"]
    assert a["findings"][0].startswith(f"desync in collective #{job.STEPS // 2 - 10} of pg {dp} (mesh_dp): "
                                       f"rank {desync} issued nccl:all_reduce [[524288]] BFloat16 while ranks ")
    assert a["findings"][0].endswith("issued nccl:all_reduce [[262144]] BFloat16 (size mismatch)")
    assert sorted((c["rank"], c["why"]) for c in a["culprits"]) == sorted([(lagging, "not-enqueued"),
                                                                          (desync, "desync")])
    # the rank whose dump never came is in no group; every other group agrees and completed
    assert all(ODD["no_dump"] not in g["ranks"] for g in a["process_groups"])
    assert len(a["process_groups"]) == 1 + N // 8 + N // 32 * 8 + 4 * 8
    # the report's section says it too, with the lagging rank behind its peers
    sec = flight.section(fr_records)
    assert sec is not None
    assert [(b["rank"], b["kind"], b["seq"], b["others_seq"]) for b in sec["behind"]] == \
        [(lagging, "enqueued", job.STEPS - 1, job.STEPS)]


def test_stack_merge_of_4k_ranks_names_the_one_rank_outside_the_all_reduce() -> None:
    members = []
    for node in range(N // job.PER_NODE):
        doc = job.stacks_node(node, N)
        members += [Member(host=p["host"], pid=p["pid"], rank=p["rank"], local_rank=p["local_rank"],
                           world_size=p["world_size"], samples=[dump_from_json(s) for s in p["samples"]])
                    for p in doc["processes"]]
    a = analyse(members)
    odd = ODD["stack"]
    assert [(s.kind, s.ranks) for s in a.suspects] == [("outside-collective", [odd])]
    assert a.verdict == (f"suspect: rank {odd} ({job.host_of(odd)}, pid {40000 + odd % 8}) stuck in train_step "
                         f"(trainer.py:97) while {N - 1} ranks are stuck in all_reduce (distributed_c10d.py:2501)")
    assert [g.state for g in a.groups] == ["stuck", "stuck"] and a.missing_ranks == [] and not a.not_dumped
    (root,) = a.tree
    assert (root["frame"], root["ranks"], root["count"]) == ("<module> (train.py:412)", f"ranks 0-{N - 1}", N)
    # the stem splits where the odd rank's stack leaves the others'
    node = root
    while len(node["children"]) == 1:
        node = node["children"][0]
    assert node["frame"] == "train_step (trainer.py:97)"
    assert sorted((c["ranks"], c["count"]) for c in node["children"]) == sorted(
        [(f"rank {odd}", 1), (f"ranks 0-{odd - 1},{odd + 1}-{N - 1}", N - 1)])


def test_rank_ranges_and_hostlists_of_16k_ranks_round_trip() -> None:
    ranks = [r for r in range(16384) if r not in (5, 9000, 16383)]
    assert compress(ranks) == "0-4,6-8999,9001-16382"
    assert expand(compress(ranks)) == ranks
    nodes = [job.host_of(r) for r in range(0, 16384, 8)]
    assert compress_hostlist(reversed(nodes)) == "gpu[00001-02048]"
    assert expand_hostlist("gpu[00001-02048]") == nodes


def test_a_nodes_equal_flight_recorder_entries_are_kept_once_and_the_analysis_is_unchanged() -> None:
    import copy

    from ml_debug.stacks.verdict import read_node_document

    n = 64
    plain = [job.fr_record(rank, n) for rank in range(n)]
    read = [r for node in range(n // job.PER_NODE)
            for r in read_node_document({"processes": [], **copy.deepcopy(job.fr_node(node, n))}, "x").fr_records]
    assert read == plain
    tp = [r["collectives"][1]["entries"] for r in read[:8]]  # ranks 0-7: one TP group on one node
    assert all(a is b for other in tp[1:] for a, b in zip(tp[0], other, strict=True))
    dp = [r["collectives"][3]["entries"] for r in read[:8]]  # 8 DP groups: equal entries, shared too
    assert all(a is b for other in dp[1:] for a, b in zip(dp[0], other, strict=True))
    desync = job.culprits(n)["desync"]  # its odd entry stays its own
    odd = read[desync]["collectives"][3]["entries"][-11]
    assert odd["input_sizes"] == [[1 << 19]] and all(odd is not r["collectives"][3]["entries"][-11]
                                                     for r in read if r is not read[desync] and r.get("ok"))
    assert fr_analyse(read) == fr_analyse(plain)


def _random_records(rng: Any) -> list[dict[str, Any]]:
    """A few ranks issuing mostly the same collectives: some behind, some with an odd entry."""
    import random

    assert isinstance(rng, random.Random)
    ops = ["nccl:all_reduce", "nccl:all_gather", "nccl:all_to_all"]
    program = [{"op": rng.choice(ops[:2]), "input_sizes": [[rng.choice([8, 16])]], "output_sizes": [[8]],
                "input_dtypes": ["Float"], "output_dtypes": ["Float"]} for _ in range(40)]
    records = []
    for rank in range(rng.randint(2, 9)):
        enq = rng.choice([30, 30, 30, 29, 28])
        entries = []
        for seq in range(enq - rng.choice([5, 10, 20]) + 1, enq + 1):
            e = {"seq": seq, **program[seq], "state": rng.choice(["completed", "scheduled"])}
            if rng.random() < .04:
                e.update(op=rng.choice(ops), input_sizes=[[rng.choice([8, 16, 32])]],
                         input_dtypes=rng.choice([["Float"], ["BFloat16"], ["Int", "Float"]]))
            entries.append(e)
        records.append({"rank": rank, "host": "h", "pid": rank, "ok": True, "collectives": [
            {"pg_id": "0", "name": "0", "desc": "", "last_enqueued": enq, "last_completed": enq - rng.randint(0, 2),
             "entries": entries}]})
    return records


def test_the_whole_run_comparison_finds_what_comparing_number_by_number_finds(monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    from ml_debug.stacks import fr_analysis

    cases = [_random_records(random.Random(seed)) for seed in range(400)]
    fast = [fr_analyse(c) for c in cases]
    monkeypatch.setattr(fr_analysis, "_scan", lambda *_: None)  # the general path, one number at a time
    slow = [fr_analyse(c) for c in cases]
    assert fast == slow
    assert sum(1 for a in fast if a and a["process_groups"][0]["mismatch"]) > 50  # desyncs were there to find


def test_one_entry_pool_for_every_node_shares_equal_entries_across_nodes_and_4k_culprits_stay_named(
        fr_records: list[dict[str, Any]]) -> None:
    from ml_debug.stacks.fr_analysis import EntryPool
    from ml_debug.stacks.verdict import read_node_document

    def copied(r: dict[str, Any]) -> dict[str, Any]:  # new lists, the same (per rank distinct) entries
        if "collectives" not in r:  # the rank whose dump never came
            return dict(r)
        return {**r, "collectives": [{**g, "entries": list(g["entries"])} for g in r["collectives"]]}

    pool = EntryPool()  # as dump-stacks reads its nodes: one pool for the run
    read = [r for node in range(N // job.PER_NODE)
            for r in read_node_document({"processes": [], "flight_recorder": {"ranks": [
                copied(x) for x in fr_records[node * 8:node * 8 + 8]]}}, job.host_of(node * 8), pool=pool).fr_records]
    assert read == fr_records
    assert fr_records[0]["collectives"][3]["entries"][0] is not fr_records[32]["collectives"][3]["entries"][0]
    # rank 0 (node 1) and rank 32 (node 5) are in one DP group: their entries are now the same objects,
    # and so are two TP groups' on nodes far apart
    for a, b, g in ((0, 32, 3), (0, 8 * 300, 1)):
        assert all(x is y for x, y in zip(read[a]["collectives"][g]["entries"], read[b]["collectives"][g]["entries"],
                                          strict=True))
    desync = ODD["desync"]  # its odd entry stays its own
    odd = read[desync]["collectives"][3]["entries"][-11]
    assert odd["input_sizes"] == [[1 << 19]] and sum(1 for r in read if r.get("ok")
                                                     and r["collectives"][3]["entries"][-11] is odd) == 1
    import gc

    gc.enable()  # (this module's fixture holds it off while the records are built)
    try:
        a = fr_analyse(read)
        assert gc.isenabled()  # the collector, held off during the analysis, is back
    finally:
        gc.disable()
    assert a == fr_analyse(fr_records)
    assert a is not None and sorted((c["rank"], c["why"]) for c in a["culprits"]) == sorted(
        [(ODD["not_enqueued"], "not-enqueued"), (desync, "desync")])
    # more distinct entries under one number than the pool keeps: the rest stay unshared, unchanged
    many = [{"rank": r, "ok": True, "collectives": [{"pg_id": "0", "entries": [
        {"seq": 1, "op": "nccl:all_reduce", "input_sizes": [[r]], "state": "completed"}]}]} for r in range(40)]
    before = [e for r in many for e in r["collectives"][0]["entries"]]
    read_node_document({"processes": [], "flight_recorder": {"ranks": many}}, "y", pool=pool)
    assert [e for r in many for e in r["collectives"][0]["entries"]] == before


def test_lines_that_cannot_hold_a_label_skip_the_label_expressions_and_get_the_same_labels(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from itertools import product

    from ml_debug.logs import labels

    heads = ["", " ", "   3: ", "3: ", "12 ", "12", "١٢: ", "[rank3]: ", "[rank3]:", "[default0]: ", "[node1:3 rank7]: ",
             "[1,3]<stderr>: ", "job7.node12 [stderr] ", "[stdout] ", "2025-03-02 01:00:00,123 ",
             "2025-03-02T01:00:00Z [rank2]: ", "2025-03-02 01:00:00,123 [INFO] ", "01:02:03 [default1]: ",
             "[2024-05-01 03:14:07] ", "Jan  3 01:00:00 ", "node12: ", "[2024-05-01] ", "E0302 03:14:07.1 ", "x" * 70]
    tails = ["", "Traceback (most recent call last):", "[INFO] step 3", "loss 1.0", ": x", "[stderr] y", "[1]: z",
             "[rank5]: w", "3: v"]
    lines = [h + t for h, t in product(heads, tails)]
    fast = [(labels.split_label(ln), labels.split_label(ln, True)) for ln in lines]
    assert sum(1 for ln in lines if labels.unlabelled(ln)) > 20  # the quick path was taken, and often
    monkeypatch.setattr(labels, "unlabelled", lambda _line: False)
    assert fast == [(labels.split_label(ln), labels.split_label(ln, True)) for ln in lines]


def test_logs_of_4k_ranks_one_file_each_name_the_rank_whose_cuda_error_came_first(tmp_path: Any) -> None:
    from ml_debug.logs.triage import triage

    job.write_logs(str(tmp_path), N, size=1024)  # bench_scale's files, shortened (it reads 16k of 64 KiB)
    report = triage([str(tmp_path)])
    odd = ODD["logs"]
    primary = report.verdict.primary
    assert primary is not None and primary.who.rank == odd and primary.who.node == job.host_of(odd)
    assert report.verdict.summary.startswith(f"first failure: rank {odd} ({job.host_of(odd)}) at ")
    assert ": RuntimeError: CUDA error: an illegal memory access was encountered (" in report.verdict.summary
    assert f"{N - 1} x \"Connection reset by peer\"" in report.verdict.summary
    assert report.ranks_seen == f"0-{N - 1}" and report.world_size == N and len(report.sources) == N


def test_top_and_watch_rounds_over_512_nodes_name_the_slow_and_the_stalled_rank_of_4k() -> None:
    got = job.sampling_rounds(N, rounds=5)  # a straggler after 3 samples, the stall after 10 s (5 x 2 s)
    slow, stalled = ODD["slow"], ODD["stalled"]
    # top: the two ranks whose step rate is far below the median; the 4,094 at the median are not outliers
    assert got["top_outliers"] == [(slow, "step_rate"), (stalled, "step_rate")]
    # watch: first both below 1/2 of the median rate for 3 samples, then the one whose file stopped: stalled
    assert got["watch_incidents"] == [("straggler", [slow, stalled]), ("stall", [stalled])]


def test_a_value_at_the_median_is_no_outlier_even_with_a_floor_of_zero() -> None:
    from ml_debug.top.verdict import far_from_median

    assert far_from_median([(i, 2.0) for i in range(6)], floor=0.0, ratio=2.0, z=3.5, min_peers=3, high=False) == []
    (far,) = far_from_median([*((i, 2.0) for i in range(6)), (9, 0.4)], floor=0.0, ratio=2.0, z=3.5, min_peers=3,
                             high=False)
    assert (far.key, far.value, far.median) == (9, 0.4, 2.0)


def test_watch_marks_a_nodes_missing_rank_exited_and_tolerates_ranks_its_owner_removed() -> None:
    from ml_debug.sampling.sample import NodeSample
    from ml_debug.watch.verdict import Tracker

    t = Tracker(stall=60.0, grace=0.0, straggler_factor=2.0, interval=2.0, node_timeout=30.0, started=0.0)
    a, b = (NodeSample.from_json(job.node_sample(i, 64, 1)) for i in (0, 1))
    t.add_node("a", a, 1.0)
    t.add_node("b", b, 1.0)
    t.take_events()
    del t.ranks["a:50003"]  # as the exporter forgets an exited rank
    a2 = NodeSample.from_json(job.node_sample(0, 64, 2))
    a2.ranks = [r for r in a2.ranks if r.pid not in (50003, 50005)]
    t.add_node("a", a2, 3.0)
    assert t.take_events() == ["rank 5 (gpu00001, pid 50005) exited"]
    assert [k for k, r in t.ranks.items() if r.status == "exited"] == ["a:50005"]
    t.add_node("a", NodeSample.from_json(job.node_sample(0, 64, 3)), 5.0)  # rank 3 comes back: watched again
    assert t.take_events() == ["watching rank 3 (gpu00001, pid 50003)"]
    assert list(t.ranks)[-1] == "a:50003" and t.ranks["a:50005"].status == "ok"
    assert all(r.status == "ok" for k, r in t.ranks.items() if k.startswith("b:"))
