"""A container runtime's own log files (CRI's /var/log/pods/.../0.log, Docker's *-json.log) read as the text the
container wrote: each record's text, its parts joined, with its time, as `kubectl logs --timestamps` shows it."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest

from ml_debug.logs.container import CRI, DOCKER, Unwrapped, kind
from ml_debug.logs.sources import Source
from ml_debug.logs.triage import triage
from tests.conftest import REPO

# a real torchrun console (`mldebug launch` of mldebug train, rank 1 turned NaN): what the pod's container wrote
CONSOLE = REPO / "tests" / "data" / "logs" / "launch_nan_rank1_stopped_first" / "vm" / "console.log"
SPLIT = 40  # the runtimes split a line at 16 KiB; shorter here, so that most lines of the console are split


def _stamp(i: int) -> str:
    return f"2026-11-28T10:{i // 60 % 60:02d}:{i % 60:02d}.123456789Z"


def _cri(text: str, split: int = SPLIT) -> bytes:
    """containerd's records of ``text``: a line longer than ``split`` in parts tagged P, its last part F."""
    out = []
    for i, line in enumerate(text.splitlines()):
        parts = [line[k:k + split] for k in range(0, len(line), split)] or [""]
        out += [f"{_stamp(i)} stderr {'F' if n == len(parts) - 1 else 'P'} {p}" for n, p in enumerate(parts)]
    return ("\n".join(out) + "\n").encode()


def _docker(text: str, split: int = SPLIT) -> bytes:
    """Docker's json-file records of ``text``: a long line in parts, only the last with its newline."""
    out = []
    for i, line in enumerate(text.splitlines()):
        parts = [line[k:k + split] for k in range(0, len(line), split)] or [""]
        parts[-1] += "\n"
        out += [json.dumps({"log": p, "stream": "stderr", "time": _stamp(i)}, separators=(",", ":")) for p in parts]
    return ("\n".join(out) + "\n").encode()


def _stamped(text: str) -> bytes:
    """The same lines as `kubectl logs --timestamps` prints them."""
    return "".join(f"{_stamp(i)} {line}\n" for i, line in enumerate(text.splitlines())).encode()


def _unwrapped(data: bytes, size: int) -> tuple[bytes, str | None]:
    src = Source("x.log", "console")
    f, parts = Unwrapped(io.BytesIO(data), src), []
    while piece := f.read(size):
        parts.append(piece)
    return b"".join(parts), src.container


@pytest.mark.parametrize("size", [1, 1000, 1 << 20, -1])
def test_records_are_unwrapped_into_the_lines_with_their_time_in_any_read_size(size: int) -> None:
    text = CONSOLE.read_text() * 40  # past one read of the runtime's file: records cut between reads
    for split in (SPLIT, 16 << 10):  # most lines in parts; none (a block of whole records is unwrapped at once)
        assert _unwrapped(_cri(text, split), size) == (_stamped(text), CRI)
        assert _unwrapped(_docker(text, split), size) == (_stamped(text), DOCKER)
    plain = CONSOLE.read_bytes() * 400  # past the first read
    assert _unwrapped(plain, size) == (plain, None)  # any other file: as it is
    f = Unwrapped(io.BytesIO(plain), Source("x.log", "console"))
    assert f.read(10) + f.read(len(plain)) == plain  # a read past what was looked at is whole


def test_the_formats_are_known_by_the_first_line_alone() -> None:
    assert kind(b"2023-10-06T00:17:09.669794202Z stdout F Hello") == CRI
    assert kind(b"2023-10-06T00:17:09.669794202+02:00 stderr P:more part") == CRI
    assert kind(b"2023-10-06T00:17:09.669794202Z stdout F") == CRI  # an empty line
    assert kind(b'{"log":"hi\\n","stream":"stdout","time":"2023-10-06T00:17:09.669794202Z"}') == DOCKER
    assert kind(b'{"log": 3}') is None and kind(b'{"log":"cut') is None  # not Docker's records
    assert kind(b"2023-10-06T00:17:09Z INFO starting") is None  # `kubectl logs --timestamps`: already the text
    assert kind(b"[default0]:Traceback (most recent call last):") is None


def test_a_line_that_is_not_a_record_is_kept_as_it_is() -> None:
    data = b"2026-11-28T10:00:00Z stderr F one\nnot a record\n2026-11-28T10:00:01Z stderr P tw\n" \
           b"2026-11-28T10:00:01Z stderr F o"  # the last record without its newline (the runtime was stopped)
    assert _unwrapped(data, 7)[0] == b"2026-11-28T10:00:00Z one\nnot a record\n2026-11-28T10:00:01Z two\n"
    said = b"2026-11-28T10:00:00Z stdout F echo 'x stdout F y'\n"  # the record's word in its text too: kept there
    assert _unwrapped(said * 3, 1 << 20)[0] == b"2026-11-28T10:00:00Z echo 'x stdout F y'\n" * 3
    data = b'{"log":"one\\n","time":"t1"}\n{"log":"half-written\n{"log":"two\\n","time":"t2"}\n'
    assert _unwrapped(data, 7)[0] == b't1 one\n{"log":"half-written\nt2 two\n'


def test_a_pods_log_reads_as_the_console_with_time_stamps(tmp_path: Path) -> None:
    """The verdict of each runtime's file (gzipped by logrotate too) is the pod's `kubectl logs --timestamps`: its
    times the records', its node the pod the kubelet's directory names; each says what was read."""
    text = CONSOLE.read_text()
    (tmp_path / "job-worker-0.log").write_bytes(_stamped(text))  # `kubectl logs --timestamps job-worker-0 > ...`
    want = triage([str(tmp_path / "job-worker-0.log")])
    assert want.verdict.primary is not None and want.verdict.primary.who.rank == 1, want.verdict.summary
    pods = tmp_path / "var" / "log" / "pods" / "default_job-worker-0_0f3c" / "trainer"
    pods.mkdir(parents=True)
    (pods / "0.log").write_bytes(_cri(text))
    (pods / "1.log.gz").write_bytes(gzip.compress(_docker(text)))
    for name, what in (("0.log", CRI), ("1.log.gz", DOCKER)):
        r = triage([str(pods / name)])
        assert r.verdict.summary == want.verdict.summary, (name, r.verdict.summary)
        assert r.sources[0].repairs == [f"a container runtime's log ({what}): each record's text read, with its time"]
        assert r.sources[0].who.node == "job-worker-0"  # the pod, from the kubelet's directory (as `kubectl logs POD`)
