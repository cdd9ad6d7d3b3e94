"""What the tests of the compressed-stream readers (zstd.py, lz4frames.py) share: a log that does not compress to
nothing, and a reader's bytes up to where it says the data ends."""

from __future__ import annotations

import io
import random
from collections.abc import Callable
from typing import IO


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
