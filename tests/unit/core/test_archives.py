"""core/archives.py on real archives made here with tarfile and zipfile: what is written, and what never is."""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from ml_debug.core import archives


def _tar(path: Path, members: dict[str, bytes], links: dict[str, str] | None = None, mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:  # type: ignore[call-overload]
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return path


def _all(rel: str) -> bool:
    return True


def test_members_are_written_under_the_directory_and_none_leaves_it(tmp_path: Path) -> None:
    into = tmp_path / "into"
    into.mkdir()
    archive = _tar(tmp_path / "logs.tar.gz", {"./job/node1/rank0.log": b"a\n", "/abs/rank1.log": b"b\n",
                                             "../../escape.log": b"c\n", "job/ckpt.pt": b"\0" * 10},
                   links={"job/node1/link.log": "/etc/passwd"})
    got = archives.unpack(str(archive), str(into), lambda rel: rel.endswith(".log"))
    written = sorted(str(p.relative_to(into)) for p in into.rglob("*") if p.is_file())
    assert written == ["abs/rank1.log", "job/node1/rank0.log"], written  # a leading / is dropped, as GNU tar does
    assert got.files == 2 and not (tmp_path / "escape.log").exists()
    assert (into / "job/node1/rank0.log").stat().st_mtime == 1_700_000_000  # the member's time: a log's day
    reasons = {s["path"].split("logs.tar.gz/", 1)[1]: s["reason"] for s in got.skipped}
    assert reasons == {"../../escape.log": "its name leads out of the archive's directory (.. or a device path): "
                                          "not unpacked",
                       "job/node1/link.log": "a link in the archive (not followed)"}, reasons
    assert not any(stat.S_ISLNK(os.lstat(p).st_mode) for p in into.rglob("*"))


@pytest.mark.parametrize("mode", ["w", "w:bz2", "w:xz"])
def test_every_compression_of_tar_the_standard_library_reads(tmp_path: Path, mode: str) -> None:
    archive = _tar(tmp_path / f"logs.tar{mode[1:].replace(':', '.')}", {"rank0.log": b"x\n"}, mode=mode)
    assert archives.kind(str(archive)) == "tar"
    got = archives.unpack(str(archive), str(tmp_path), _all)
    assert got.files == 1 and (tmp_path / "rank0.log").read_bytes() == b"x\n"


def test_a_zip_and_its_links(tmp_path: Path) -> None:
    archive = tmp_path / "logs.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("job/rank0.log", "zipped\n")
        link = zipfile.ZipInfo("job/link.log")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(link, "/etc/passwd")
        z.writestr("../up.log", "no\n")
    got = archives.unpack(str(archive), str(tmp_path / "into"), _all)
    assert got.files == 1 and (tmp_path / "into/job/rank0.log").read_text() == "zipped\n"
    assert not (tmp_path / "up.log").exists() and not (tmp_path / "into/job/link.log").exists()
    assert sorted(s["reason"].split(" ")[0] for s in got.skipped) == ["a", "its"], got.skipped


def test_a_truncated_archive_keeps_what_came_before_the_damage(tmp_path: Path) -> None:
    whole = _tar(tmp_path / "whole.tar", {"a/rank0.log": b"first\n" * 100, "a/rank1.log": os.urandom(200_000)}, mode="w")
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(gzip.compress(whole.read_bytes())[:-60_000])  # a download that stopped part way
    got = archives.unpack(str(cut), str(tmp_path / "into"), _all)
    assert (tmp_path / "into/a/rank0.log").read_bytes() == b"first\n" * 100
    assert got.skipped and got.skipped[-1]["path"] == str(cut), got.skipped
    assert got.skipped[-1]["reason"].startswith("a damaged or truncated archive: "), got.skipped


def test_the_unpacked_size_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archives, "UNPACK_LIMIT", 1000)
    archive = _tar(tmp_path / "bomb.tar.gz", {"a.log": b"0" * 900, "b.log": b"1" * 900, "c.log": b"2" * 10})
    got = archives.unpack(str(archive), str(tmp_path / "into"), _all)
    assert (tmp_path / "into/a.log").stat().st_size == 900 and (tmp_path / "into/b.log").stat().st_size == 100
    assert [s["path"].rsplit("/", 1)[1] for s in got.skipped] == ["c.log"] and "past 0 GiB" in got.skipped[0]["reason"]


def test_an_archive_mldebug_cannot_read_says_how_to_unpack_it() -> None:
    assert archives.kind("/x/logs.7z") == "unreadable" and archives.kind("/x/rank0.log.gz") is None
    assert archives.kind("/x/logs.tar.zst") == archives.kind("/x/logs.TZST") == archives.kind("/x/l.tar.lz4") == "tar"
    assert archives.unpack_hint("/x/logs.rar") == "unrar x /x/logs.rar"


def test_a_member_that_cannot_be_written_is_skipped_alone(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "odd.tar.gz", {"a.log": b"a\n", "a.log/b.log": b"b\n", "c.log": b"c\n"})
    got = archives.unpack(str(archive), str(tmp_path / "into"), _all)
    assert got.files == 2 and (tmp_path / "into/c.log").read_bytes() == b"c\n"
    assert [s["path"].rsplit("odd.tar.gz/", 1)[1] for s in got.skipped] == ["a.log/b.log"], got.skipped
