"""Reading a job's logs in several processes gives the report one reader gives (ml_debug/logs/readers.py)."""

from __future__ import annotations

import gzip
from typing import Any

import pytest

from ml_debug.core.output import to_jsonable
from ml_debug.logs import events, readers
from ml_debug.logs.events import Collector
from ml_debug.logs.sources import Source, expand
from ml_debug.logs.triage import build_report, triage
from tests.conftest import REPO
from tests.fakes import hooks_env

DATA = REPO / "tests" / "data"
# every kind of log the tests keep: launch directories with manifests, torchelastic trees and error files,
# NCCL_DEBUG=INFO consoles, srun/torchrun/mpirun/pdsh/deepspeed/accelerate/lightning consoles, pasted logs
KEPT = sorted(str(p) for p in (DATA / "logs").iterdir() if p.name != "README.md") + sorted(
    str(p) for p in (DATA / "logs_corpus").glob("*.log"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The logs the tests keep, and two gzip copies of one: whole, and cut half-way (read up to the cut)."""
    d = tmp_path_factory.mktemp("gz")
    data = gzip.compress((DATA / "logs_corpus" / "torchrun-oom.log").read_bytes())
    (d / "whole.log.gz").write_bytes(data)
    (d / "cut.log.gz").write_bytes(data[:len(data) // 2])
    return [*KEPT, str(d)]


def _report(collector: Collector, reads: list[readers.Read], exp: Any) -> dict[str, Any]:
    skipped = list(exp.skipped) + [r.skipped for r in reads if r.skipped]
    report = build_report(collector, [r.info for r in reads], [r.metrics for r in reads if r.metrics], skipped)
    return to_jsonable(report)


def test_the_corpus_has_many_sources_and_every_shape(corpus: list[str]) -> None:
    exp = expand(corpus)
    assert len(exp.sources) >= 30
    assert {"launch", "torchelastic", "error-file", "console"} <= {s.shape for s in exp.sources}
    assert sum(s.codec == "gzip" for s in exp.sources) == 2


@pytest.mark.parametrize("caps", [False, True], ids=["as-shipped", "small-caps"])
def test_collectors_taken_in_give_what_one_collector_reads(caps: bool, corpus: list[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Every source read into a collector of its own, then taken in in order (the most merges there can
    be) gives the report of one collector; with caps small enough to be reached too."""
    if caps:
        for name, value in (("MAX_EVENTS", 9), ("MAX_SUSPECTS", 2), ("MAX_SAMPLED", 5)):
            monkeypatch.setattr(events, name, value)
    exp = expand(corpus)
    one = Collector()
    alone = [readers.read_source(src, i, one) for i, src in enumerate(exp.sources)]

    exp = expand(corpus)
    merged = Collector()
    shared = []
    for i, src in enumerate(exp.sources):
        own = Collector()
        read = readers.read_source(src, i, own)
        shared += readers.take_in(merged, own.portable(), [read])
    if caps:
        assert one.dropped > 0 and len(one.events) == 9 and len(one.suspects) <= 2 and len(one.sampled) == 5
    first, second = _report(one, alone, exp), _report(merged, shared, exp)
    assert first["verdict"]["primary"] is not None
    assert second == first


def _shares_of(sizes_and_dirs: list[tuple[int, str]], want: int) -> list[range]:
    return readers._shares([Source(path=f"{d}/f{i}.log", shape="console", size=n)
                            for i, (n, d) in enumerate(sizes_and_dirs)], want)


def test_shares_cover_every_source_in_order_and_keep_a_directory_together() -> None:
    # a rank's stdout and stderr (one directory) stay in one share while a cut can wait for the next directory
    tree = [(100, f"attempt_0/{r}") for r in range(8) for _ in range(2)]
    shares = _shares_of(tree, 4)
    assert [i for s in shares for i in s] == list(range(16))
    assert len(shares) == 4 and all(s.start % 2 == 0 for s in shares)
    # a flat directory of many files is still shared out
    flat = _shares_of([(100, "logs")] * 64, 8)
    assert [i for s in flat for i in s] == list(range(64)) and len(flat) >= 4
    assert max(len(s) for s in flat) <= 2 * 64 // 8


def test_a_compressed_source_weighs_as_the_text_it_holds() -> None:
    """A job's .gz logs hold about 8 times their size in text (10-52x in benchmarks/bench_logs.py's mixes): 10 MiB of
    them are read by reader processes as 80 MiB of text would be, and share out against plain files by their text."""
    mib = 1 << 20
    assert readers.readers_for([Source(path="a.log.gz", shape="console", size=10 * mib, codec="gzip")]) \
        == readers.default_jobs()
    assert readers.readers_for([Source(path="a.log", shape="console", size=10 * mib)]) == 1
    both = [Source(path="n0/a.log.gz", shape="console", size=100, codec="gzip"),
            Source(path="n1/b.log", shape="console", size=800)]
    assert readers._shares(both, 2) == [range(0, 1), range(1, 2)]


def _document(paths: list[str], jobs: int) -> dict[str, Any]:
    return to_jsonable(triage(paths, jobs=jobs))


@pytest.fixture(scope="module")
def one_reader(corpus: list[str]) -> dict[str, Any]:
    return _document(corpus, 1)


def test_reader_processes_give_the_report_of_one_reader(corpus: list[str], one_reader: dict[str, Any]) -> None:
    seen: list[int] = []
    report = triage(corpus, jobs=3, on_source=lambda i, n: seen.append(i))
    assert to_jsonable(report) == one_reader
    assert any("truncated" in s["reason"] for s in one_reader["skipped"])  # the cut file, said by a reader too
    assert sorted(seen) == list(range(len(report.sources)))


def test_a_reader_that_dies_loses_nothing(corpus: list[str], one_reader: dict[str, Any],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for var, value in hooks_env("tests.fakes.logs_readers", {"MLDEBUG_FAKE_READER": "die"}).items():
        monkeypatch.setenv(var, value)
    assert _document(corpus, 2) == one_reader
