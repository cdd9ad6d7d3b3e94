"""Zstandard-compressed files (``rank3.log.zst``, ``job.tar.zst``) read as a stream that ends where the data does.

The ``zstandard`` package's own stream reader returns a frame cut short as if it were whole: a copy that stopped
half-way would read as a complete log. :class:`ZstdFile` raises ``EOFError`` there instead, after returning every
byte decompressed before it, as gzip, lzma and bz2 do; damaged data raises ``EOFError`` too. Frames written one
after another (``cat a.zst b.zst``, pzstd, a log appended to by ``zstd -c >>``) are read in turn.

Input is fed 4 KiB at a time, so that what is held decompressed stays bounded: about 128 MiB at the very most (a zstd
block holds 128 KiB, and a run of one byte compresses to 4 bytes per block), a few tens of KiB for a log."""

from __future__ import annotations

import io
from typing import IO

import zstandard

_FEED = 4 << 10


class ZstdFile(io.BufferedIOBase):
    """The decompressed data of a zstd stream, read forward only (``read1`` returns what one step decompressed)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self._decompressor = zstandard.ZstdDecompressor()
        self._frame = self._decompressor.decompressobj()
        self._in_frame = False  # a frame begun and not ended
        self._pending = b""  # decompressed, returned from self._at on
        self._at = 0
        self._done = False
        self._damage: EOFError | None = None  # raised once what came before it has been returned
        self._read = 0  # compressed bytes fed

    def readable(self) -> bool:
        return True

    def read1(self, size: int = -1) -> bytes:
        while self._at == len(self._pending) and not self._done:
            self._step()
        if self._at == len(self._pending) and self._damage is not None:
            damage, self._damage = self._damage, None
            raise damage
        start = self._at
        self._at = len(self._pending) if size is None or size < 0 else min(start + size, len(self._pending))
        return self._pending[start:self._at]  # only what is returned is copied

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return b"".join(iter(self.read1, b""))
        parts, got = [], 0
        while got < size and (piece := self.read1(size - got)):
            parts.append(piece)
            got += len(piece)
        return b"".join(parts)

    def _step(self) -> None:
        data = self._raw.read(_FEED)
        if not data:
            self._done = True
            if self._in_frame:
                self._damage = EOFError(f"the data ends inside a zstd frame, after {self._read} compressed bytes")
            return
        self._read += len(data)
        out = []
        while data:
            if self._frame.eof:  # the previous frame ended: the next one starts here
                self._frame = self._decompressor.decompressobj()
            try:
                out.append(self._frame.decompress(data))
            except zstandard.ZstdError as e:
                self._done = True
                self._damage = EOFError(f"damaged zstd data near compressed byte {self._read}: {e}")
                break
            self._in_frame = not self._frame.eof
            data = self._frame.unused_data if self._frame.eof else b""
        self._pending, self._at = b"".join(out), 0
