"""`mldebug logs ARCHIVE`: a job's logs as users share them (.tar.gz, .zip) read as their directory is, each file
shown under the archive's name, and nothing left behind in the temporary directory."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest

from ml_debug.core.errors import UsageError
from ml_debug.logs.triage import demux, triage
from tests.conftest import REPO

JOB = REPO / "tests" / "data" / "logs" / "launch_nan_rank1_stopped_first"  # an `mldebug launch` node: manifest, tree


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory archives are unpacked into, watched."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def _archives(tmp_path: Path) -> list[Path]:
    tgz, zipped = tmp_path / "job.tgz", tmp_path / "job.zip"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(JOB, arcname=JOB.name)
    with zipfile.ZipFile(zipped, "w") as z:
        for f in sorted(JOB.rglob("*")):
            z.write(f, f.relative_to(JOB.parent))
    return [tgz, zipped]


@pytest.mark.parametrize("jobs", [1, 2])  # 2: reader processes open the unpacked files
def test_an_archive_reads_as_its_directory(tmp_path: Path, scratch: Path, jobs: int) -> None:
    plain = triage([str(JOB)], jobs=1)
    for archive in _archives(tmp_path):
        r = triage([str(archive)], jobs=jobs)
        assert r.verdict.summary == plain.verdict.summary and r.verdict.primary is not None
        assert r.verdict.primary.who.rank == 1 and r.verdict.primary.who.node == "vm"
        shown = [s.path.replace(str(archive), str(JOB.parent)) for s in r.sources]
        assert shown == [s.path for s in plain.sources] and [s.shape for s in r.sources] == [s.shape for s in plain.sources]
        assert all(s.path.startswith(f"{archive}/{JOB.name}/vm/") for s in r.sources), [s.path for s in r.sources]
        assert r.verdict.primary.source.startswith(f"{archive}/"), r.verdict.primary.source
        assert list(scratch.iterdir()) == [], "the unpacked files were left behind"


def test_one_ranks_lines_from_an_archive(tmp_path: Path, scratch: Path) -> None:
    lines: list[tuple[str, str]] = []
    out = demux([str(_archives(tmp_path)[0])], rank=0, node=None, emit=lambda src, n, text: lines.append((src, text)))
    assert out["lines"] == len(lines) > 0 and any("non-finite loss on rank 1" in text for _, text in lines)
    assert all(src.startswith(str(tmp_path / "job.tgz")) for src in out["sources"]) and list(scratch.iterdir()) == []


def test_an_archive_with_a_link_and_a_damaged_end(tmp_path: Path, scratch: Path) -> None:
    """What the archive holds before its damage is read; a link in it is named, not followed."""
    archive = tmp_path / "cut.tar"
    data = (REPO / "tests" / "data" / "logs_corpus" / "mpirun.log").read_bytes()
    with tarfile.open(archive, "w") as tar:
        tar.add(REPO / "tests" / "data" / "logs_corpus" / "mpirun.log", arcname="job/mpirun.log")
        link = tarfile.TarInfo("job/rank9.log")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
        tar.addfile(link)
        big = tarfile.TarInfo("job/zz/rank5.log")
        big.size = 100_000
        tar.addfile(big, io.BytesIO(b"step\n" * 20_000))
    archive.write_bytes(archive.read_bytes()[:len(data) + 3 * 512 + 50_000])  # a copy that stopped part way
    r = triage([str(archive)])
    assert [s.path for s in r.sources] == [f"{archive}/job/mpirun.log"] and r.sources[0].bytes == len(data)
    assert r.verdict.primary is not None and r.verdict.primary.who.rank == 2, r.verdict.summary
    reasons = {s["path"]: s["reason"] for s in r.skipped}
    assert reasons[f"{archive}/job/rank9.log"] == "a link in the archive (not followed)"
    assert reasons[str(archive)].startswith("a damaged or truncated archive"), reasons
    assert list(scratch.iterdir()) == []


def test_an_archive_python_cannot_unpack_is_a_usage_error_that_says_how(tmp_path: Path, scratch: Path) -> None:
    zst = tmp_path / "job.tar.zst"
    zst.write_bytes(b"(\xb5/\xfd")
    with pytest.raises(UsageError) as e:
        triage([str(zst)])
    assert f"tar --zstd -xf {zst}, then give the directory" in str(e.value), e.value
    empty = tmp_path / "empty.zip"
    with zipfile.ZipFile(empty, "w") as z:
        z.writestr("model.pt", b"\0")
    with pytest.raises(UsageError) as e:
        triage([str(empty)])
    assert "an archive with no log file in it" in str(e.value) and list(scratch.iterdir()) == []
    shutil.rmtree(scratch)


def test_a_refused_path_after_an_archive_leaves_nothing_behind(tmp_path: Path, scratch: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(UsageError):
        triage([str(_archives(tmp_path)[0]), str(fifo)])
    assert list(scratch.iterdir()) == []
