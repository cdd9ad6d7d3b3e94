"""Flight Recorder dump files: how they are found, NCCL's pickle layout (the keys NCCL's dump on timeout
writes: version, pg_config, pg_status, entries with record_id, collective_seq_id, p2p_seq_id, profiling_name,
state, sizes, times), a file that is not a dump and a pickle that would run code. Real gloo dumps of real
jobs are read in tests/cli/test_logs_postmortem.py."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from ml_debug.postmortem.frdumps import analyse_dump_dir, find, is_dump_path, looks_like_dump, rank_from_name


def _entry(seq: int, op: str, state: str = "completed", pg: int = 0, p2p: bool = False) -> dict:
    return {"record_id": seq - 1, "pg_id": pg, "process_group": ("0", "default_pg"), "collective_seq_id": 0 if p2p
            else seq, "p2p_seq_id": seq if p2p else 0, "op_id": seq, "profiling_name": f"nccl:{op}",
            "time_created_ns": 1_795_000_000_000_000_000 + seq, "duration_ms": 1.5, "input_sizes": [[1024]],
            "input_dtypes": ["Float"], "output_sizes": [[1024]], "output_dtypes": ["Float"], "state": state,
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": state == "completed",
            "timeout_ms": 600000, "is_p2p": p2p, "frames": [{"name": "all_reduce", "filename": "train.py", "line": 7}]}


def _dump(rank: int, ops: list[str], last_done: int) -> bytes:
    entries = [_entry(i + 1, op, "completed" if i + 1 <= last_done else "scheduled") for i, op in enumerate(ops)]
    entries.append(_entry(1, "send", p2p=True))  # point-to-point entries are not collectives
    return pickle.dumps({"version": "2.10", "comm_lib_version": "2.27.3",
                         "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
                         "pg_status": {"0": {"last_enqueued_collective": len(ops), "last_started_collective": len(ops),
                                             "last_completed_collective": last_done}},
                         "entries": entries, "nccl_comm_state": {}})


def test_nccl_layout_a_rank_that_never_issued_and_a_missing_dump(tmp_path: Path) -> None:
    for r in (0, 2):
        (tmp_path / f"nccl_trace_rank_{r}").write_bytes(_dump(r, ["all_reduce"] * 5, 4))
    (tmp_path / "nccl_trace_rank_1").write_bytes(_dump(1, ["all_reduce"] * 4, 4))
    got = analyse_dump_dir(tmp_path)
    assert got["analysis"]["findings"] == ["rank 1 never issued collective #5 of pg 0 (default_pg) (nccl:all_reduce "
                                           "[[1024]] Float), which ranks 0,2 issued"]
    assert got["missing_dumps"] == [3] and "no dump from rank(s) 3" in got["evidence"]
    assert len(got["files"]) == 3 and got["unreadable"] == []


def test_a_desync_in_nccl_layout(tmp_path: Path) -> None:
    for r in range(4):
        ops = ["all_reduce"] * 5 + (["all_gather"] if r == 2 else ["all_reduce"])
        (tmp_path / f"nccl_trace_rank_{r}").write_bytes(_dump(r, ops, 5))
    got = analyse_dump_dir(tmp_path)
    assert [(c["rank"], c["why"]) for c in got["analysis"]["culprits"]] == [(2, "desync")]
    assert got["analysis"]["findings"][0].startswith("desync in collective #6 of pg 0 (default_pg): rank 2 issued "
                                                     "nccl:all_gather")


def test_finding_by_name_prefix_and_content(tmp_path: Path) -> None:
    assert rank_from_name("/tmp/nccl_trace_rank_12") == (12, "nccl-name")
    assert rank_from_name("run/fr-3.json") == (3, "mldebug-name")
    assert rank_from_name("/scratch/fr/trace_7", "/scratch/fr/trace_") == (7, "prefix")
    assert rank_from_name("/elsewhere/trace_7", "/scratch/fr/trace_") == (None, None)
    assert rank_from_name("train.log") == (None, None)
    data = _dump(0, ["all_reduce"], 1)
    assert looks_like_dump(data[:4096]) and not looks_like_dump(b"Traceback (most recent call last):\n")
    (tmp_path / "rank0.bin").write_bytes(data)
    (tmp_path / "train.log").write_text("step 1\n")
    assert is_dump_path(str(tmp_path / "rank0.bin")) and not is_dump_path(str(tmp_path / "train.log"))
    os.mkfifo(tmp_path / "pipe0")  # never opened (nothing would ever write to it)
    assert not is_dump_path(str(tmp_path / "pipe0"))
    found = find([str(tmp_path / "rank0.bin"), str(tmp_path / "train.log"), str(tmp_path / "pipe0")])
    assert [(os.path.basename(f.path), f.rank, f.how) for f in found] == [("rank0.bin", 0, "content")]


def test_a_file_that_is_no_dump_and_a_pickle_that_would_run_code(tmp_path: Path) -> None:
    (tmp_path / "nccl_trace_rank_0").write_bytes(_dump(0, ["all_reduce"] * 2, 2))
    (tmp_path / "nccl_trace_rank_1").write_bytes(b"garbage")

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "ran"),))

    (tmp_path / "nccl_trace_rank_2").write_bytes(pickle.dumps({"entries": [Evil()], "pg_status": {}}))
    got = analyse_dump_dir(tmp_path)
    reasons = {os.path.basename(u["path"]): u["reason"] for u in got["unreadable"]}
    assert sorted(reasons) == ["nccl_trace_rank_1", "nccl_trace_rank_2"]
    assert "refused global" in reasons["nccl_trace_rank_2"] and not (tmp_path / "ran").exists()


def test_a_real_nccl_dump_from_the_h200() -> None:
    """NCCL's own pickle (tests/data/flight_recorder/nccl-h200: one rank, PyTorch 2.11, NCCL 2.28) through the
    library call: read, summarised, its world (1) from pg_config, no rank missing, nothing to compare."""
    from tests.conftest import REPO

    got = analyse_dump_dir(REPO / "tests" / "data" / "flight_recorder" / "nccl-h200")
    assert got["unreadable"] == [] and len(got["files"]) == 1 and got["missing_dumps"] == []
    (rank,) = got["ranks"]
    assert rank["ok"] and rank["rank"] == 0 and rank["world"] == 1 and rank["version"] == "2.10"
    pg0 = next(pg for pg in rank["process_groups"] if pg["pg_id"] == "0")
    assert (pg0["last_completed_seq"], pg0["last_enqueued_seq"]) == (6, 7)
    assert got["analysis"] is None and got["evidence"] == "flight recorder: 1 rank(s) dumped, none behind the others"


def test_dumps_in_archives_by_name_a_big_tar_not_listed_and_nothing_left(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import tarfile
    import tempfile
    import zipfile

    from ml_debug.postmortem import frdumps

    real = Path(__file__).parents[2] / "data" / "flight_recorder" / "nccl-h200" / "nccl_trace_rank_0"
    small, big, zipped, logs = (tmp_path / n for n in ("small.tgz", "big.tar", "any.zip", "logs.tgz"))
    for archive in (small, big):
        with tarfile.open(archive, "w:gz" if archive.suffix == ".tgz" else "w") as tar:
            tar.add(real, arcname="job/nccl_trace_rank_0")
            tar.add(real, arcname="job/fr-3.json")
            tar.add(real, arcname="job/notes.txt")  # a dump's bytes, not a dump's name: not taken from an archive
    with zipfile.ZipFile(zipped, "w") as z:
        z.write(real, "trace_7")  # named by --fr-prefix's base only
    with tarfile.open(logs, "w:gz") as tar:
        tar.add(real, arcname="rank0.log")
    monkeypatch.setattr(frdumps, "ARCHIVE_SEARCH_BYTES", small.stat().st_size)
    assert big.stat().st_size > frdumps.ARCHIVE_SEARCH_BYTES and zipped.stat().st_size > frdumps.ARCHIVE_SEARCH_BYTES
    assert frdumps.in_archives([str(small)]) and not frdumps.in_archives([str(big), str(logs)])
    assert not frdumps.in_archives([str(zipped)]) and frdumps.in_archives([str(zipped)], prefix="/elsewhere/trace_")
    shared = tmp_path / "shared"  # in a directory named: found, a link to one is not followed
    (shared / "a" / "b").mkdir(parents=True)
    (shared / "link.tgz").symlink_to(small)
    assert not frdumps.in_archives([str(shared)])
    (shared / "a" / "b" / "job.tgz").write_bytes(small.read_bytes())
    assert frdumps.in_archives([str(shared)])
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with frdumps.unpacked([str(small), str(big), str(zipped)], prefix="trace_") as (found, damaged):
        assert [(d.path, d.rank, d.how) for d in found] == [
            (f"{small}/job/nccl_trace_rank_0", 0, "nccl-name"), (f"{small}/job/fr-3.json", 3, "mldebug-name"),
            (f"{zipped}/trace_7", 7, "prefix")]
        assert damaged == [] and all(Path(d.file or "").read_bytes() == real.read_bytes() for d in found)
        records = frdumps.read(found).records
        assert [(r["file"], r["ok"]) for r in records] == [(d.path, True) for d in found]
    assert list(scratch.iterdir()) == []
