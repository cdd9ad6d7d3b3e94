"""LZ4-compressed files (``rank3.log.lz4``, ``job.tar.lz4``), as the ``lz4`` tool and logrotate's ``compresscmd lz4``
write them, read as a stream that ends where the data does.

The ``lz4`` package's frame reader already raises ``EOFError`` where the data ends inside a frame, after returning
what came before it, and reads frames written one after another in turn. Damaged data (a frame's checksum, which the
``lz4`` tool writes, not matching; a header that is not lz4's) it reports as ``RuntimeError``: :class:`Lz4File`
raises ``EOFError`` there too, as gzip, lzma, bz2 and :mod:`ml_debug.core.zstd` do, so that a reader keeps what came
before the damage and says where it stopped. An empty file reads as empty, as an empty ``.gz`` does."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import IO

import lz4.frame


class _Counted(io.RawIOBase):
    """A stream that counts the bytes read from it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw, self.count = raw, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self._raw.read(len(b))
        b[:len(data)] = data
        self.count += len(data)
        return len(data)


class Lz4File(io.BufferedIOBase):
    """The decompressed data of an lz4 stream, read forward only."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = _Counted(raw)
        self._f = lz4.frame.LZ4FrameFile(self._raw, mode="rb")

    def readable(self) -> bool:
        return True

    def read1(self, size: int = -1) -> bytes:
        return self._read(self._f.read1, size)

    def read(self, size: int | None = -1) -> bytes:
        return self._read(self._f.read, -1 if size is None else size)

    def close(self) -> None:
        self._f.close()
        super().close()

    def _read(self, read: Callable[[int], bytes], size: int) -> bytes:
        try:
            return read(size)
        except RuntimeError as e:  # "LZ4F_decompress failed with code: ERROR_contentChecksum_invalid"
            raise EOFError(f"damaged lz4 data ({e})") from e
        except EOFError:
            if self._raw.count == 0:  # nothing at all: an empty file
                return b""
            raise
