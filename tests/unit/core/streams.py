"""What the tests of the compressed-stream readers (zstd.py, lz4frames.py) share: a log that does not compress to
nothing, a reader's bytes up to where it says the data ends, and a compressed tar unpacked whole and cut."""

from __future__ import annotations

import io
import random
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from ml_debug.core import archives
from ml_debug.core.archives import Unpacked


def numbered_log(lines: int, seed: int = 1) -> bytes:
    """Training lines with numbers that do not repeat: the compressed stream is long."""
    rng = random.Random(seed)
    return b"".join(b"step %d loss %.6f lr %.3e\n" % (i, rng.random(), rng.random()) for i in range(lines))


def read_up_to_damage(reader: Callable[[IO[bytes]], io.BufferedIOBase], data: bytes,
                      size: int = 1 << 20) -> tuple[bytes, str | None]:
    """The bytes ``reader`` gives of ``data`` in ``read1(size)`` calls, and its EOFError's words (None: none)."""
    f, got = reader(io.BytesIO(data)), []
    try:
        while piece := f.read1(size):
            got.append(piece)
    except EOFError as e:
        return b"".join(got), str(e)
    return b"".join(got), None


def unpack_whole_and_cut(tmp: Path, compress: Callable[[bytes], bytes], whole_name: str,
                         cut_name: str) -> Unpacked:
    """A tar of two logs, compressed and named ``whole_name``, unpacked whole (both logs there), and a copy cut in
    half, named ``cut_name``, unpacked (the first log there, alone): what unpacking the cut copy gave."""
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w") as tar:
        for name, data in (("job/rank0.log", b"step 1\n"), ("job/rank1.log", numbered_log(100_000, 2))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = compress(plain.getvalue())
    whole, cut = tmp / whole_name, tmp / cut_name
    whole.write_bytes(data)
    cut.write_bytes(data[:len(data) // 2])
    got = archives.unpack(str(whole), str(tmp / "whole"), lambda rel: True)
    assert got.files == 2 and not got.skipped
    assert (tmp / "whole/job/rank1.log").read_bytes() == numbered_log(100_000, 2)
    got = archives.unpack(str(cut), str(tmp / "cut"), lambda rel: True)
    assert got.files == 1 and (tmp / "cut/job/rank0.log").read_bytes() == b"step 1\n"
    assert [s["path"] for s in got.skipped] == [str(cut)]
    return got
