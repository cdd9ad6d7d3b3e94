"""`mldebug logs ARCHIVE`: a job's logs as users share them (.tar.gz, .tar.zst, .tar.lz4, .zip) read as their directory is, each file
shown under the archive's name, and nothing left behind in the temporary directory."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path

import lz4.frame
import pytest
import zstandard

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
    tgz, zipped, tzst, tlz4 = (tmp_path / f"job.{x}" for x in ("tgz", "zip", "tar.zst", "tar.lz4"))
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(JOB, arcname=JOB.name)
    with zipfile.ZipFile(zipped, "w") as z:
        for f in sorted(JOB.rglob("*")):
            z.write(f, f.relative_to(JOB.parent))
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w") as tar:
        tar.add(JOB, arcname=JOB.name)
    tzst.write_bytes(zstandard.ZstdCompressor().compress(plain.getvalue()))  # `tar --zstd -cf`'s
    tlz4.write_bytes(lz4.frame.compress(plain.getvalue(), content_checksum=True))  # `tar -c ... | lz4`'s
    return [tgz, zipped, tzst, tlz4]


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


def test_an_archive_mldebug_cannot_unpack_is_a_usage_error_that_says_how(tmp_path: Path, scratch: Path) -> None:
    seven = tmp_path / "job.7z"
    seven.write_bytes(b"7z\xbc\xaf\x27\x1c")
    with pytest.raises(UsageError) as e:
        triage([str(seven)])
    assert f"7z x {seven}, then give the directory" in str(e.value), e.value
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


def _compress(codec: str, data: bytes) -> bytes:
    import bz2
    import lzma

    return {"xz": lzma.compress, "bz2": bz2.compress, "zst": zstandard.ZstdCompressor().compress,
            "lz4": lambda d: lz4.frame.compress(d, content_checksum=True)}[codec](data)  # the `lz4` tool's frames


@pytest.mark.parametrize("codec", ["xz", "bz2", "zst", "lz4"])
def test_a_compressed_log_reads_as_the_plain_one_up_to_its_damage(tmp_path: Path, codec: str) -> None:
    """logrotate's and `xz -r`'s copies: read as the plain file; one cut short is read up to the cut and said."""
    plain = REPO / "tests" / "data" / "logs_corpus" / "mpirun.log"
    data = _compress(codec, plain.read_bytes() + b"".join(b"step %d\n" % i for i in range(300_000)))
    whole, cut = tmp_path / f"job.log.{codec}", tmp_path / f"cut.log.{codec}"
    whole.write_bytes(data)
    cut.write_bytes(data[:len(data) // 2])
    want = triage([str(plain)]).verdict
    for path in (whole, cut):
        r = triage([str(path)])
        assert r.verdict.summary == want.summary and r.verdict.primary is not None, r.verdict.summary
        assert r.sources[0].bytes > len(plain.read_bytes())
    r = triage([str(tmp_path)])
    name = {"xz": "xz", "bz2": "bzip2", "zst": "zstd", "lz4": "lz4"}[codec]
    assert [(s["path"], s["reason"].split(":")[0]) for s in r.skipped] == [
        (str(cut), f"truncated or damaged {name} file")], r.skipped


def test_a_damaged_lz4_log_is_read_up_to_the_damage(tmp_path: Path) -> None:
    """A byte changed in a frame: what came before it is read (the frames before it whole), the damage is said, and
    a file that is not lz4 at all is said to be damaged; an empty one is an empty log."""
    plain = (REPO / "tests" / "data" / "logs_corpus" / "mpirun.log").read_bytes()
    frame = bytearray(_compress("lz4", b"step 2\n" * 100_000))
    frame[len(frame) // 2] ^= 0xFF
    (tmp_path / "job.log.lz4").write_bytes(_compress("lz4", plain) + bytes(frame))
    (tmp_path / "other.log.lz4").write_bytes(b"plain text, named .lz4\n")
    (tmp_path / "empty.log.lz4").write_bytes(b"")
    r = triage([str(tmp_path)])
    assert r.verdict.summary == triage([str(REPO / "tests" / "data" / "logs_corpus" / "mpirun.log")]).verdict.summary
    reasons = {s["path"].rsplit("/", 1)[1]: s["reason"] for s in r.skipped}
    read = int(reasons["job.log.lz4"].removeprefix("truncated or damaged lz4 file: only its first ").split(" B ")[0])
    assert read >= len(plain) and "(EOFError: damaged lz4 data (LZ4F_decompress failed with code: ERROR_" in \
        reasons["job.log.lz4"], reasons
    assert "ERROR_frameType_unknown" in reasons["other.log.lz4"] and "empty.log.lz4" not in reasons, reasons


def test_an_archive_in_a_directory_is_read_one_level_deep(tmp_path: Path, scratch: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory of what a user collected: the launch directory as an archive beside a console; an archive in
    that archive, and one too big to be logs, are named as not read; a member cut short is read up to the cut."""
    from ml_debug.logs import sources

    shared = tmp_path / "shared"
    shared.mkdir()
    tgz = _archives(tmp_path)[0]
    with tarfile.open(shared / "job.tgz", "w:gz") as tar:
        tar.add(JOB, arcname=JOB.name)
        tar.add(tgz, arcname=f"{JOB.name}/inner.tgz")
        lz4 = tarfile.TarInfo(f"{JOB.name}/rank7.log.lz4")
        lz4.size = 4
        tar.addfile(lz4, io.BytesIO(b"\x04\x22\x4d\x18"))
    monkeypatch.setattr(sources, "ARCHIVE_IN_DIR_BYTES", (shared / "job.tgz").stat().st_size)
    (shared / "big.tgz").write_bytes(b"\0" * (sources.ARCHIVE_IN_DIR_BYTES + 1))  # never opened
    r = triage([str(shared)])
    plain = triage([str(JOB)])
    assert r.verdict.summary == plain.verdict.summary, r.verdict.summary
    cut = f"{shared / 'job.tgz'}/{JOB.name}/rank7.log.lz4"
    assert [s.path for s in r.sources if not s.path.startswith(f"{shared / 'job.tgz'}/{JOB.name}/vm/")] == [cut]
    reasons = {s["path"]: s["reason"] for s in r.skipped}
    assert reasons.pop(f"{shared / 'job.tgz'}/{JOB.name}/inner.tgz").startswith("an archive inside an archive (not opened)")
    assert reasons.pop(cut).startswith(  # a member cut short is read too
        "truncated or damaged lz4 file: only its first 0 B (decompressed) were read")
    assert reasons.pop(str(shared / "big.tgz")).endswith("name it on the command line to read it") and not reasons
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("codec", ["xz", "zst", "lz4"])
def test_a_launch_directory_compressed_file_by_file_reads_as_it_was(tmp_path: Path, codec: str) -> None:
    """`xz -r`, `zstd -r --rm` or `lz4 -m --rm` over an `mldebug launch` directory, its manifest too: the manifest
    still names the node, its console stays the node's console, its torchrun files theirs."""
    job = tmp_path / JOB.name
    shutil.copytree(JOB, job)
    for f in sorted(job.rglob("*")):
        if f.is_file():
            f.with_name(f"{f.name}.{codec}").write_bytes(_compress(codec, f.read_bytes()))
            f.unlink()
    assert (job / "vm" / f"launch.json.{codec}").is_file()
    plain, packed = triage([str(JOB)]), triage([str(job)])
    assert packed.verdict.summary == plain.verdict.summary and "rank 1 (vm)" in plain.verdict.summary, \
        packed.verdict.summary
    assert [(s.path.replace(str(job), str(JOB)), s.shape) for s in packed.sources] == [
        (f"{s.path}.{codec}", s.shape) for s in plain.sources]
    # and as the archive of that directory
    with tarfile.open(tmp_path / "job.tar.gz", "w:gz") as tar:
        tar.add(job, arcname=JOB.name)
    assert triage([str(tmp_path / "job.tar.gz")]).verdict.summary == plain.verdict.summary
