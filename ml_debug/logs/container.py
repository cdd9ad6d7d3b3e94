"""A container runtime's own log files, read as the text the container wrote.

On a Kubernetes or Docker node, the files a log shipper reads (``/var/log/pods/NS_POD_UID/CONTAINER/0.log``, their
links in ``/var/log/containers/``, Docker's ``/var/lib/docker/containers/ID/ID-json.log``) wrap every line the
container wrote in a record of the runtime:

- the CRI format (containerd, CRI-O): ``2026-11-28T10:00:00.123456789Z stderr F <text>``; a line over 16 KiB is
  split into records tagged ``P`` (partial) before its last one, tagged ``F``;
- Docker's json-file driver: ``{"log":"<text>\\n","stream":"stderr","time":"2026-11-28T10:00:00.123456789Z"}``; a long
  line is split into records whose text has no newline before its last one.

:class:`Unwrapped` recognises either by the file's first line and gives each line's text, its parts joined, with the
record's time in front, as ``kubectl logs --timestamps`` shows it (labels.py reads that stamp). Any other file passes
through untouched. Offsets and sizes are then the unwrapped text's, as a compressed file's are its decompressed
text's.
"""

from __future__ import annotations

import json
import re
from typing import IO

from ml_debug.logs.sources import Source

CRI = "CRI"
DOCKER = "docker json-file"
_CRI_LINE = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d) (?:stdout|stderr) [PF](?:[: ]|$)")
_WHOLE = (b"stdout F ", b"stderr F ")
_TAG_CUT = len(b" stdout F ") - 1  # what unwrapping a whole line's record takes off it
_BLOCK = 1 << 20


def kind(first_line: bytes) -> str | None:
    """The runtime's format a file's first line is in, or None (the container's own text)."""
    if _CRI_LINE.match(first_line):
        return CRI
    if first_line.startswith(b'{"log":"'):
        try:
            rec = json.loads(first_line)
        except ValueError:
            return None
        return DOCKER if isinstance(rec, dict) and isinstance(rec.get("log"), str) else None
    return None


class Unwrapped:
    """A source's stream, the runtime's records unwrapped when its first line is one (``src.container`` then says
    which format)."""

    def __init__(self, f: IO[bytes], src: Source) -> None:
        self._f, self._src = f, src
        self._out = b""  # unwrapped, returned up to self._at
        self._at = 0
        self._rest = b""  # read, after the last whole record
        self._kind: str | None = None
        self._started = self._eof = False
        self._open = False  # the last record's line goes on (a partial record)

    def read(self, size: int = -1) -> bytes:
        if not self._started:
            self._start()
        while self._kind is not None and not self._eof and (size < 0 or len(self._out) - self._at < size):
            self._fill(self._f.read(_BLOCK))
        end = len(self._out) if size < 0 else min(self._at + size, len(self._out))
        data, self._at = self._out[self._at:end], end  # returned from an offset: a small read copies little
        if self._kind is None and (size < 0 or len(data) < size):  # the container's own text: as it is
            data += self._f.read(-1 if size < 0 else size - len(data))
        return data

    def _start(self) -> None:
        self._started = True
        first = self._f.read(_BLOCK)
        self._kind = kind(first.split(b"\n", 1)[0])
        if self._kind is None:
            self._out = first
            return
        self._src.container = self._kind
        self._fill(first)

    def _fill(self, data: bytes) -> None:
        if not data:
            self._eof = True
            block, self._rest = (self._rest + b"\n" if self._rest else b""), b""
        else:
            data = self._rest + data
            cut = data.rfind(b"\n") + 1
            block, self._rest = data[:cut], data[cut:]
        if block:  # whole records, each ending in a newline
            text = self._cri_block(block) if self._kind == CRI else self._docker_block(block)
            self._out, self._at = self._out[self._at:] + text, 0

    def _cri_block(self, block: bytes) -> bytes:
        lines = block.count(b"\n")
        # every line a whole line's record (a year first, one stream-and-tag word each, which the replacing counts:
        # each takes _TAG_CUT bytes off; a partial record has none): each such word is its line's own
        if not self._open and block[:1] == b"2" and block.count(b"\n2") == lines - 1:
            text = block.replace(b" stdout F ", b" ").replace(b" stderr F ", b" ")
            if len(block) - len(text) == _TAG_CUT * lines:
                return text
        return b"".join([self._cri(r) for r in block[:-1].split(b"\n")])

    def _docker_block(self, block: bytes) -> bytes:
        records = block[:-1].split(b"\n")
        try:  # the block's records in one parse; record by record when one of them is not a record
            recs = json.loads(b"[" + block[:-1].replace(b"\n", b",") + b"]")
        except ValueError:
            recs = None
        if recs is None or len(recs) != len(records):
            return b"".join(self._docker(r) for r in records)
        if not self._open:  # every record a whole line (Docker writes one newline at most, at a record's end)
            try:
                text = "".join([rec["time"] + " " + rec["log"] for rec in recs])
            except (TypeError, KeyError):
                text = ""
            if text.count("\n") == len(recs) and text.endswith("\n"):
                return text.encode("utf-8", "surrogateescape")
        return b"".join(self._docker_record(rec, r) for rec, r in zip(recs, records, strict=True))

    def _cri(self, record: bytes) -> bytes:
        at = record.find(b" ") + 1
        if not self._open and record[at:at + 9] in _WHOLE and record[10:11] == b"T" and record[4:5] == b"-":
            return record[:at] + record[at + 9:] + b"\n"  # a whole line's record: the common case, quickly
        parts = record.split(b" ", 3)
        if len(parts) < 3 or not _CRI_LINE.match(record):
            self._open = False
            return record + b"\n"  # not a record: the line as it is
        stamp = b"" if self._open else parts[0] + b" "
        self._open = parts[2].split(b":", 1)[0] == b"P"
        return stamp + (parts[3] if len(parts) > 3 else b"") + (b"" if self._open else b"\n")

    def _docker(self, record: bytes) -> bytes:
        try:
            rec = json.loads(record)
        except ValueError:
            rec = None
        return self._docker_record(rec, record)

    def _docker_record(self, rec: object, record: bytes) -> bytes:
        text = rec.get("log") if isinstance(rec, dict) else None
        if not isinstance(rec, dict) or not isinstance(text, str):
            self._open = False
            return record + b"\n"  # not a record: the line as it is
        time = rec.get("time")
        stamp = b"" if self._open or not isinstance(time, str) else time.encode() + b" "
        self._open = not text.endswith("\n")
        return stamp + text.encode("utf-8", "surrogateescape")
