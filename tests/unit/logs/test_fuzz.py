"""`mldebug logs` reads whatever it is handed: consoles of dead jobs, pasted, damaged, binary. Logs are built at
random from real fragments (the lines of tests/data/logs and tests/data/logs_corpus, and the pieces the other tests
of this folder write: labels, stamps, tqdm bars, colour) and damaged the way files get damaged (cut mid-line,
interleaved, lines doubled or lost, invalid UTF-8, NUL bytes, CRLF, no final newline, long lines, quoting, line
numbers, hard wraps, reversed). For each: the report is made and its JSON document validates, the primary event
points at a line of its file, a rank's lines (demux) are lines of their files in order, and reading in small
blocks gives the same report as reading each file in one block.

What the fuzzing found, each fixed since, is pinned by the tests at the end: the lines above a line looked up
across the reader's blocks, launchers marked wherever blocks start, a mended file's offsets and size within the
file, the head of a file sniffed alike whatever its size."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ml_debug.core.output import document, dumps, to_jsonable
from ml_debug.core.ranges import expand as expand_ranks
from ml_debug.logs import scan
from ml_debug.logs import triage as triage_module
from ml_debug.logs.repair import SNIFF_BYTES
from ml_debug.logs.result import SCHEMA, SCHEMA_VERSION, TIME_NEARBY, LogsReport, SourceInfo, Who
from ml_debug.logs.triage import demux, triage
from tests.conftest import REPO, validate_schema

DATA = REPO / "tests" / "data"


def _real_files() -> list[list[bytes]]:
    """The lines (ends kept) of every real log under tests/data/logs and tests/data/logs_corpus."""
    paths = sorted(p for d in ("logs", "logs_corpus") for p in (DATA / d).rglob("*")
                   if p.is_file() and p.suffix in (".log", ".out", ".txt") and p.stat().st_size)
    return [p.read_bytes().splitlines(keepends=True) for p in paths]


REAL = _real_files()

# Pieces the other tests of tests/unit/logs write (each a real shape: see the test named beside it).
FRAMES = ('  File "/opt/venv/lib/python3.11/site-packages/urllib3/connection.py", line 466, in getresponse\n'
          "    httplib_response = super().getresponse()\n")
PIECES = [
    # test_repeats.py: a handled error after a logging record, chained exceptions, torch's prefix, colour, tqdm
    "2026-11-28 04:00:01,000 [WARNING] data: fetching shard 00001 failed, retrying (1/5)\n"
    "Traceback (most recent call last):\n" + FRAMES + "TimeoutError: The read operation timed out\n\n",
    "Traceback (most recent call last):\n" + FRAMES + "TimeoutError: The read operation timed out\n\n"
    "During handling of the above exception, another exception occurred:\n\nTraceback (most recent call last):\n"
    '  File "/job/train.py", line 9, in <module>\n    main()\nRuntimeError: gave up on shard 7\n',
    "Traceback (most recent call last):\n" + FRAMES + "OSError: [Errno 5] Input/output error\n\n"
    "The above exception was the direct cause of the following exception:\n\n"
    "Traceback (most recent call last):\n  File \"/job/train.py\", line 3, in <module>\nValueError: bad batch\n",
    "[rank3]: Traceback (most recent call last):\n[rank3]:   File \"/job/train.py\", line 9, in <module>\n"
    "[rank3]:     main()\n[rank3]: ValueError: bad batch on rank 3\n",
    "\x1b[33m2026-11-28 04:00:02,000 WARNING\x1b[0m retrying\nTraceback (most recent call last):\n" + FRAMES
    + "TimeoutError: timed out\n",
    "Epoch 3:  50%|#####     | 5/10 [00:01<00:01, 4.2it/s]\rEpoch 3: 100%|##########| 10/10\n",
    "\rtrain:  10%|#         | 10/100 [00:01<00:09,  9.9it/s]\rtrain:  20%|##        | 20/100 [00:02<00:08,  9.9it/s]"
    "2026-11-28 04:00:03,000 [INFO] step 20\n",
    "node001:4242:4300 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[2] via P2P/IPC/read\n",
    # test_untested_paths.py: colour inside srun's labels
    "0: \x1b[1;35mValueError\x1b[0m: \x1b[35mbad batch on rank 0\x1b[0m\n1: \x1b[32mstep 1\x1b[0m\n",
    # test_untested_paths_2.py: kubectl logs --timestamps, a CUDA error and torchrun's agent line
    "2024-05-01T03:14:07.123456789Z Traceback (most recent call last):\n"
    '2024-05-01T03:14:07.123456789Z   File "/job/train.py", line 41, in <module>\n'
    "2024-05-01T03:14:07.123456789Z     loss.backward()\n"
    "2024-05-01T03:14:07.123456789Z RuntimeError: CUDA error: an illegal memory access was encountered\n"
    "2024-05-01T03:14:07.123456789Z For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "2024-05-01T03:14:08.512000000Z ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) "
    "local_rank: 1 (pid: 4243) of binary: /usr/bin/python3\n",
    # test_launchers.py: Open MPI 5 and 4
    "[1,0]<stdout>:step 1\n[1,2]<stdout>:step 1\nprterun detected that one or more processes exited with non-zero "
    "status,\nthus causing the job to be terminated. The first process to do so was:\n\n"
    "   Process name: [prterun-vm-4242@1,2]\n   Exit code:    3\n",
    "mpirun noticed that process rank 5 with PID 777 on node gpu03 exited on signal 11 (Segmentation fault).\n",
    # test_catalogue.py: Ray's log monitor
    "(RayTrainWorker pid=81234, ip=10.0.0.12) Traceback (most recent call last):\n"
    '(RayTrainWorker pid=81234, ip=10.0.0.12)   File "/job/train.py", line 12, in <module>\n'
    "(RayTrainWorker pid=81234, ip=10.0.0.12) ValueError: bad batch\n(pid=81235, ip=10.0.0.13) step 10\n",
    "3d3e22c3066f:168:168 [0] misc/shmutils.cc:72 NCCL WARN Error: failed to extend /dev/shm/nccl-UbzKZ9 to "
    "9637892 bytes\n",
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n",
]
PIECE_LINES = [p.encode().splitlines(keepends=True) for p in PIECES]

# What launchers and collectors put in front of a line (labels.py's docstring lists them), and time stamps.
LABELS = ["", "0: ", "  3: ", "[default1]:", "[node12:5]:", "[node12:5 rank37]: ", "[rank2]: ", "[1,3]<stderr>:",
          "(RayTrainWorker pid=81234, ip=10.0.0.12) ", "(pid=81235) ", "job7.node12 [stderr] ", "node12: ",
          "1: [default3]:", "2024-05-01T03:14:07.123456789Z ", "[2024-05-01 03:14:07,123] ", "E0501 03:14:07.123456 ",
          "May  1 03:14:07 ", "\x1b[36m0: \x1b[0m"]
BAD_BYTES = [b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\x80\x80", b"\x00", b"\x00" * 7, b"\r", b"\x1b[",
             b"\x1b[31m", b"\xef\xbb\xbf", b"\t", b"\x0c"]
NAMES = ["rank0.log", "rank1.log", "rank3.log", "console.log", "slurm-4242.out", "node1.err", "job.txt",
         "trainjob-worker-0.log", "log_rank_2.txt", "stderr.log"]
MAX_PAD = 48_000  # bytes of real lines put before the chunks (the small blocks below are 16-24 kB)
MAX_LONG = 40_000  # the longest line made: well under scan.MAX_LINE (1 MiB), so every test stays quick


@st.composite
def _chunk(draw: st.DrawFn) -> list[bytes]:
    """A run of real lines (a piece of a real log, or a piece the tests write), maybe each under one label."""
    if draw(st.booleans()):
        lines = draw(st.sampled_from(REAL))
        start = draw(st.integers(0, len(lines) - 1))
        lines = lines[start:start + draw(st.integers(1, 40))]
    else:
        lines = draw(st.sampled_from(PIECE_LINES))
    label = draw(st.sampled_from(LABELS)).encode()
    return [label + ln for ln in lines] if label else list(lines)


def _interleave(draw: st.DrawFn, a: list[bytes], b: list[bytes]) -> list[bytes]:
    """Two writers' lines, in an order drawn at random (each writer's own order kept)."""
    order = draw(st.lists(st.booleans(), min_size=len(a) + len(b), max_size=len(a) + len(b)))
    out, i, j = [], 0, 0
    for first in order:
        if (first and i < len(a)) or j >= len(b):
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out


def _at(draw: st.DrawFn, lines: list[bytes]) -> int:
    return draw(st.integers(0, max(0, len(lines) - 1)))


def _damage(draw: st.DrawFn, lines: list[bytes], op: str) -> list[bytes]:
    """``lines`` with one kind of damage done to them."""
    if not lines and op not in ("long", "bytes"):
        return lines
    i = _at(draw, lines)
    if op == "dup":
        return lines[:i + 1] + lines[i:i + draw(st.integers(1, 5))] + lines[i + 1:]
    if op == "drop":
        return lines[:i] + lines[i + draw(st.integers(1, 5)):]
    if op == "cut":  # the rest of a line lost (and its newline: the next line goes on after it)
        return lines[:i] + [lines[i][:draw(st.integers(0, max(0, len(lines[i]) - 1)))]] + lines[i + 1:]
    if op == "bytes":  # invalid UTF-8, NUL, a stray \r or escape, anywhere in a line
        bad = draw(st.sampled_from(BAD_BYTES))
        if not lines:
            return [bad]
        k = draw(st.integers(0, len(lines[i])))
        return lines[:i] + [lines[i][:k] + bad + lines[i][k:]] + lines[i + 1:]
    if op == "long":  # a long line: a bar redrawn with \r and never ended, binary junk, a repeated word
        n = draw(st.integers(1, MAX_LONG))
        unit = draw(st.sampled_from([b"x", b"\rEpoch 1:  50%|#####     | 5/10 [00:01<00:01, 4.2it/s]", b"\x00\xff",
                                     b"Traceback (most recent call last):", b" "]))
        long = (unit * (n // len(unit) + 1))[:n] + draw(st.sampled_from([b"\n", b""]))
        return lines[:i] + [long] + lines[i:]
    if op == "crlf":
        every = draw(st.booleans())
        return [ln[:-1] + b"\r\n" if ln.endswith(b"\n") and (every or k % 2) else ln for k, ln in enumerate(lines)]
    if op == "quote":  # markdown quoting, pasted into an issue
        return [b"> " + ln for ln in lines]
    if op == "number":  # a viewer's line numbers
        first = draw(st.integers(0, 3000))
        sep = draw(st.sampled_from([" | ", ": ", "\t", "  ", " │ "]))
        return [f"{first + k:>5}{sep}".encode() + ln for k, ln in enumerate(lines)]
    if op == "wrap":  # hard-wrapped by a terminal
        width = draw(st.integers(20, 120))
        out = []
        for ln in lines:
            body, end = (ln[:-1], b"\n") if ln.endswith(b"\n") else (ln, b"")
            pieces = [body[k:k + width] for k in range(0, len(body), width)] or [b""]
            out += [p + b"\n" for p in pieces[:-1]] + [pieces[-1] + end]
        return out
    if op == "reverse":  # pasted bottom-to-top
        return [ln if ln.endswith(b"\n") else ln + b"\n" for ln in reversed(lines)]
    raise AssertionError(op)


OPS = ["dup", "drop", "cut", "bytes", "long", "crlf", "quote", "number", "wrap", "reverse"]


@st.composite
def log_file(draw: st.DrawFn) -> bytes:
    """One log's bytes: real chunks, maybe two writers interleaved, then damaged."""
    chunks = draw(st.lists(_chunk(), max_size=6))
    if len(chunks) >= 2 and draw(st.booleans()):
        chunks = [_interleave(draw, chunks[0], chunks[1])] + chunks[2:]
    lines = [ln for c in chunks for ln in c]
    if draw(st.booleans()):  # real lines before them, so that what follows meets the reader's block boundaries
        pad, real = draw(st.integers(0, MAX_PAD)), draw(st.sampled_from(REAL))
        filler: list[bytes] = []
        while sum(map(len, filler)) < pad:
            filler += real
        lines = filler + lines
    for op in draw(st.lists(st.sampled_from(OPS), max_size=4)):
        lines = _damage(draw, lines, op)
    data = b"".join(lines)
    end = draw(st.sampled_from(["as is", "no final newline", "cut", "as is"]))
    if end == "no final newline":
        data = data.rstrip(b"\n")
    elif end == "cut" and data:
        data = data[:draw(st.integers(0, len(data) - 1))]
    return data


logs = st.dictionaries(st.sampled_from(NAMES), log_file(), min_size=1, max_size=3)


def _write(folder: str, files: dict[str, bytes]) -> list[str]:
    paths = []
    for name, data in sorted(files.items()):
        path = os.path.join(folder, name)
        with open(path, "wb") as f:
            f.write(data)
        paths.append(path)
    return paths


def _line_starts(data: bytes) -> list[int]:
    """The offset of each line of ``data`` (a last line without a newline is a line)."""
    starts = [0] + [m.end() for m in re.finditer(b"\n", data)]
    return starts[:-1] if starts[-1] == len(data) else starts


def _mended(src: SourceInfo) -> bool:
    """The source was mended before it was read (repair.mend): its offsets are the mended text's."""
    return any("pdsh" not in r for r in src.repairs)


def _check(paths: list[str], files: dict[str, bytes], report: LogsReport) -> None:
    doc = json.loads(dumps(document(SCHEMA, SCHEMA_VERSION, report, environment={})))
    validate_schema(doc, "logs")
    by_path = {p: files[os.path.basename(p)] for p in paths}
    p = report.verdict.primary
    if p is not None:
        assert p.source in by_path, (p.source, paths)
        data = by_path[p.source]
        starts = _line_starts(data)
        assert 1 <= p.line <= len(starts), (p.line, len(starts), p)
        src = next(s for s in report.sources if s.path == p.source)
        assert 0 <= p.offset <= len(data), (p.offset, len(data), p)  # a mended file's too (mending only takes away)
        if not _mended(src):  # read as it is: the offset is where its line starts
            assert p.offset == starts[p.line - 1], (p.offset, starts[p.line - 1], p)
    ranks = expand_ranks(report.ranks_seen) if report.ranks_seen else []
    for rank in ranks[:1] + ranks[-1:]:
        got: list[tuple[str, int, str]] = []
        demux(paths, rank=rank, node=None, emit=lambda s, n, t, got=got: got.append((s, n, t)), jobs=1)
        last: dict[str, int] = {}
        for source, n, _ in got:
            assert 1 <= n <= len(_line_starts(by_path[source])), (source, n)
            assert n > last.get(source, 0), (source, n, last)
            last[source] = n


def _read(paths: list[str], block: int = scan.BLOCK) -> LogsReport:
    """The report with the reader's blocks ``block`` bytes long (test_repeats.py: tracebacks straddle them), and
    every line of each block sampled for its labels (not only the first SAMPLE_BYTES of each block: which lines
    that is depends on where blocks start, by design; see test_srun_labelled_lines_name_srun_wherever_...).

    The blocks are longer than the head that repair.sniff looks at (SNIFF_BYTES), as the real 1 MiB block is: a
    shorter one would show it less of the file, and it would rightly see other damage."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(scan, "BLOCK", block)
        m.setattr(scan, "WINDOW", min(scan.WINDOW, block // 4))
        m.setattr(scan, "SAMPLE_BYTES", 1 << 30)
        m.setattr(triage_module, "BLOCK", block)
        return triage(paths, jobs=1)


FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BLOCKS = st.integers(SNIFF_BYTES + 1, SNIFF_BYTES + (8 << 10))


@FUZZ
@given(files=logs, block=BLOCKS)
def test_any_log_is_read_and_its_report_holds(files: dict[str, bytes], block: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        paths = _write(folder, files)
        report = triage(paths, jobs=1)
        _check(paths, files, report)
        assert to_jsonable(_read(paths, block)) == to_jsonable(_read(paths))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLDEBUG_JSON", "COLUMNS", "MLDEBUG_HISTORY")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "ml_debug", *args], capture_output=True, text=True, timeout=120,
                          env=env)


@settings(FUZZ, max_examples=5)
@given(files=logs)
def test_the_command_reads_them_too(files: dict[str, bytes]) -> None:
    """docs/commands/logs.md "Exit codes": 0, 1, 2 or 4, never 70 (an internal error); stdout is one document."""
    with tempfile.TemporaryDirectory() as folder:
        got = _cli("logs", *_write(folder, files), "--json")
    assert got.returncode in (0, 1, 2, 4), (got.returncode, got.stderr[-2000:])
    doc: dict[str, Any] = json.loads(got.stdout)
    validate_schema(doc, "logs" if doc["schema"] == SCHEMA else "error")
    assert (got.returncode == 1) == (doc["result"].get("verdict", {}).get("status") in ("failure", "secondary-only",
                                                                                        "suspect")), doc["result"]


# ----------------------------------------------------------------------------- what the fuzzing found

# What a line needs from the lines above it (the logging record before a traceback, the nearest time stamp, Open
# MPI's process name, torchrun's summary entry) is found when the reader's 1 MiB block boundary falls between them
# (scan.CONTEXT_BYTES: the fuzzing above found the first two lost there). Each case: the lines above end ``at``
# bytes from where the second block starts (-100: inside the first block, the control), the line that reads them
# back follows.
BOUNDARIES = [pytest.param(-100, id="inside-a-block"), pytest.param(0, id="starts-a-block"),
              pytest.param(-5, id="straddles-blocks")]


def _at_boundary(tmp: Path, name: str, filler: bytes, above: bytes, at: int, below: bytes) -> LogsReport:
    """A log of ``filler`` lines, then ``above`` ending ``at`` bytes from the start of the reader's second block,
    then ``below``; its report."""
    end = scan.BLOCK + at - len(above)
    lines = filler * (end // len(filler)) + (b"x" * (end % len(filler) - 1) + b"\n" if end % len(filler) else b"")
    log = tmp / name
    log.write_bytes(lines + above + below)
    return triage([str(log)], jobs=1)


@pytest.mark.parametrize("at", BOUNDARIES)
def test_a_handled_traceback_at_a_block_boundary_is_still_handled(at: int, tmp_path: Path) -> None:
    """A WARNING record then its traceback (the program caught the error and went on): handled."""
    report = _at_boundary(tmp_path, "job.log", b"2026-11-28 04:00:00,000 [INFO] trainer: step 1 | loss 2.1\n",
                          b"2026-11-28 04:00:01,000 [WARNING] data: fetching shard 00001 failed, retrying (1/5)\n",
                          at, b"Traceback (most recent call last):\n"
                              b'  File "/job/data.py", line 4, in fetch\n'
                              b"    return get(url)\n"
                              b"TimeoutError: The read operation timed out\n"
                              b"2026-11-28 04:00:02,000 [INFO] trainer: step 2 | loss 2.1\n")
    assert [(e.cls, bool(e.detail.get("handled"))) for e in report.events] == [("warning", True)], report.events
    assert report.verdict.status == "none", report.verdict.summary


@pytest.mark.parametrize("at", BOUNDARIES)
def test_open_mpis_failed_rank_at_a_block_boundary(at: int, tmp_path: Path) -> None:
    """Open MPI's ``Exit code:`` takes its rank from ``Process name:`` on the line above (logs_corpus/mpirun.log)."""
    report = _at_boundary(tmp_path, "mpi.log", b"[1,0]<stdout>:step 1 loss 2.1\n",
                          b"mpirun detected that one or more processes exited with non-zero status, thus causing\n"
                          b"the job to be terminated. The first process to do so was:\n\n"
                          b"  Process name: [[25205,1],2]\n", at, b"  Exit code:    1\n")
    p = report.verdict.primary
    assert p is not None and p.who.rank == 2 and p.detail["exit_code"] == 1, report.verdict.summary


@pytest.mark.parametrize("at", BOUNDARIES)
def test_torchruns_root_cause_at_a_block_boundary(at: int, tmp_path: Path) -> None:
    """torchrun's summary without its header: its ``exitcode`` line reads the entry's rank, host, time back."""
    report = _at_boundary(tmp_path, "agent.log", b"[default0]:step 1 loss 2.1\n",
                          b"Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-27_04:21:00\n"
                          b"  host      : node7\n  rank      : 3 (local_rank: 1)\n", at,
                          b"  exitcode  : 1 (pid: 29409)\n  error_file: <N/A>\n"
                          b"  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n")
    p = report.verdict.primary
    assert p is not None and p.who == Who(3, "node7", 1) and p.detail["torchrun_root_cause"], report.verdict.summary


@pytest.mark.parametrize("at", BOUNDARIES)
def test_the_time_of_a_traceback_without_its_own_at_a_block_boundary(at: int, tmp_path: Path) -> None:
    """An unstamped traceback is timed by the stamped line just above it (blocks.time_before, TIME_NEARBY)."""
    report = _at_boundary(tmp_path, "rank0.log", b"2026-11-28 04:00:00 step 1 | loss 2.1\n",
                          b"2026-11-28 04:00:07 step 2 | loss 2.0\n", at,
                          b"Traceback (most recent call last):\n  File \"/job/train.py\", line 9, in <module>\n"
                          b"ValueError: bad batch\n")
    p = report.verdict.primary
    assert p is not None and p.time_source == TIME_NEARBY and "at 04:00:07" in report.verdict.summary, (
        p, report.verdict.summary)


@pytest.mark.parametrize("at", [pytest.param(-100, id="straddles-into-the-sample"),
                                pytest.param(8000, id="past-the-sample")])
def test_srun_labelled_lines_name_srun_wherever_the_blocks_start(at: int, tmp_path: Path) -> None:
    """An unlabelled training log, then srun --label lines (two tasks' consoles pasted together): srun is a
    launcher of the file wherever the reader's blocks begin (the lines read for what they say are marked, as the
    sampled ones are). Who writes in the file is seen from those lines and from the first SAMPLE_BYTES of each
    block (docs/commands/logs.md): rank 1's ordinary line is seen only inside that sample."""
    report = _at_boundary(tmp_path, "job.log", b"2026-11-28 04:00:00,000 [INFO] trainer: step 1 | loss 2.1\n",
                          b"", at, b"0: Traceback (most recent call last):\n"
                                   b'0:   File "/job/train.py", line 9, in <module>\n0:     main()\n'
                                   b"0: ValueError: bad batch on rank 0\n1: step 2\n")
    assert report.launchers == ["srun"], report.launchers
    assert report.sources[0].view == ("ranks 0-1" if at < 0 else "ranks 0"), report.sources[0].view


def test_a_mended_files_offsets_stay_in_the_file(tmp_path: Path) -> None:
    """A quoted log (mended: quoting removed) with invalid UTF-8: the failure's offset is in the file."""
    data = b"> " + b"\xff" * 100 + b"\n> ValueError: bad batch\n"
    log = tmp_path / "rank0.log"
    log.write_bytes(data)
    report = triage([str(log)], jobs=1)
    p = report.verdict.primary
    assert p is not None and p.line == 2 and "markdown quoting" in report.sources[0].repairs[0], report.verdict.summary
    assert p.offset <= len(data) and report.sources[0].bytes == len(data), (p.offset, report.sources[0].bytes)


def _quoted_head() -> bytes:
    """About SNIFF_BYTES of a pasted log, four lines in five quoted (markdown quoting, just: repair._quoted wants
    80%), the line that goes past SNIFF_BYTES not quoted."""
    head = b""
    for k in range(10_000):
        if len(head) > SNIFF_BYTES - 200:
            break
        head += b"".join(b"> 2026-11-28 04:00:00 step %05d\n" % (5 * k + i) for i in range(4))
        head += b"an unquoted line %05d\n" % k
    return head + b"an unquoted line " + b"y" * (SNIFF_BYTES - len(head) + 40) + b"\n"


def test_the_head_of_a_file_is_sniffed_alike_whatever_its_size(tmp_path: Path) -> None:
    """Two pasted logs with the same first SNIFF_BYTES, one under the reader's block (1 MiB), one over: the damage
    seen in that head (markdown quoting) is mended in both."""
    tail = b"> Traceback (most recent call last):\n>   File \"/job/train.py\", line 9, in <module>\n> ValueError: bad\n"
    more = b"".join(b"> 2026-11-28 04:00:01 step %07d\n" % i for i in range(scan.BLOCK // 30))
    repairs = []
    for name, data in (("short.log", _quoted_head() + tail), ("long.log", _quoted_head() + more + tail)):
        (tmp_path / name).write_bytes(data)
        repairs.append(triage([str(tmp_path / name)], jobs=1).sources[0].repairs)
    assert repairs[1] == ["markdown quoting ('> ') removed"], repairs
    assert repairs[0] == repairs[1], repairs
