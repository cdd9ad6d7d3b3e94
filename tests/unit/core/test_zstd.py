"""ZstdFile: a zstd stream read whole, frame after frame, and one cut short or damaged read up to the damage, which
is then said (the zstandard package's own reader returns a cut frame's data as if it were all)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import zstandard

from ml_debug.core.zstd import ZstdFile
from tests.unit.core.streams import numbered_log, read_up_to_damage, unpack_whole_and_cut


def _read(data: bytes, size: int = 1 << 20) -> tuple[bytes, str | None]:
    return read_up_to_damage(ZstdFile, data, size)


def test_whole_frames_one_after_another_and_nothing() -> None:
    one, two = numbered_log(50_000), b"appended later\n"
    zstd = zstandard.ZstdCompressor()
    assert _read(zstd.compress(one)) == (one, None)
    assert _read(zstd.compress(one) + zstd.compress(two)) == (one + two, None)  # `zstd -c >>`, pzstd
    assert _read(b"") == (b"", None)
    assert ZstdFile(io.BytesIO(zstd.compress(one))).read() == one
    f = ZstdFile(io.BytesIO(zstd.compress(one)))
    assert f.read(10) + f.read(7) == one[:17] and f.readable()


def test_a_cut_stream_is_read_up_to_the_cut_and_said() -> None:
    one = numbered_log(200_000)
    data = zstandard.ZstdCompressor().compress(one)
    # what zstandard itself gives: the cut frame's data, no error
    alone = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data[:len(data) // 2])).read()
    assert 0 < len(alone) < len(one)
    got, why = _read(data[:len(data) // 2])
    assert one.startswith(got) and 0 < len(got) < len(one)
    assert why == f"the data ends inside a zstd frame, after {len(data) // 2} compressed bytes"


def test_damaged_data_is_said() -> None:
    good = zstandard.ZstdCompressor().compress(b"fine\n")
    got, why = _read(good + b"\x28\xb5\x2f\xfd" + bytes(range(200)))
    assert got == b"fine\n" and why is not None and why.startswith("damaged zstd data near compressed byte")
    assert _read(b"not zstd at all")[1] is not None


def test_a_tar_zst_is_unpacked_and_one_cut_keeps_what_came_before(tmp_path: Path) -> None:
    got = unpack_whole_and_cut(tmp_path, zstandard.ZstdCompressor().compress, "job.tar.zst", "cut.tzst")
    assert got.skipped[0]["reason"].startswith("a damaged or truncated archive: the data ends inside a zstd frame")


@pytest.mark.parametrize("size", [1, 4096, 1 << 20])
def test_any_read_size_gives_the_same_bytes(size: int) -> None:
    one = numbered_log(5_000)
    assert _read(zstandard.ZstdCompressor(level=19).compress(one), size) == (one, None)
