"""Lz4File: an lz4 stream read whole, frame after frame; one cut short or damaged read up to the damage, which is
then said as EOFError (the lz4 package says damage as RuntimeError); an empty file is empty."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import lz4.frame

from ml_debug.core.lz4frames import Lz4File
from tests.conftest import require
from tests.unit.core.streams import numbered_log, read_up_to_damage, unpack_whole_and_cut


def _lz4(data: bytes) -> bytes:
    return lz4.frame.compress(data, content_checksum=True)  # as the `lz4` tool writes them


def _read(data: bytes, size: int = 1 << 20) -> tuple[bytes, str | None]:
    return read_up_to_damage(Lz4File, data, size)


def test_whole_frames_one_after_another_and_nothing() -> None:
    one, two = numbered_log(50_000), b"appended later\n"
    assert _read(_lz4(one)) == (one, None)
    assert _read(_lz4(one) + _lz4(two)) == (one + two, None)  # `lz4 -c >>`
    assert _read(b"") == (b"", None)
    f = Lz4File(io.BytesIO(_lz4(one)))
    assert f.read(10) + f.read(7) == one[:17] and f.read() == one[17:] and f.readable()


def test_the_lz4_tools_own_file_reads() -> None:
    """What the `lz4` command writes (4 MiB independent blocks, a content checksum; tests/rig/up.sh installs it)."""
    require(shutil.which("lz4"), "the lz4 command (Debian package lz4)")
    tool = subprocess.run(["lz4", "-c"], input=numbered_log(100_000), capture_output=True, check=True)
    assert _read(tool.stdout) == (numbered_log(100_000), None)


def test_a_cut_or_damaged_stream_is_read_up_to_the_damage_and_said() -> None:
    one = numbered_log(200_000)
    data = _lz4(one)
    got, why = _read(data[:len(data) // 2])
    assert one.startswith(got) and 0 < len(got) < len(one)
    assert why == "Compressed file ended before the end-of-stream marker was reached"
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 0xFF
    got, why = _read(_lz4(b"fine\n") + bytes(damaged))
    assert got.startswith(b"fine\n") and why == "damaged lz4 data (LZ4F_decompress failed with code: " \
        "ERROR_contentChecksum_invalid)"
    assert _read(b"not lz4 at all") == (b"", "damaged lz4 data (LZ4F_decompress failed with code: "
                                                 "ERROR_frameType_unknown)")


def test_a_tar_lz4_is_unpacked_and_one_cut_keeps_what_came_before(tmp_path: Path) -> None:
    got = unpack_whole_and_cut(tmp_path, _lz4, "job.tar.lz4", "cut.tar.lz4")
    assert got.skipped[0]["reason"] == ("a damaged or truncated archive: Compressed file ended before the "
                                        "end-of-stream marker was reached (1 file(s) before it were read)")
