"""The quick paths of the log reader read what the plain path reads: a traceback read once and put back whole (or
its frames) at its repeats (ml_debug/logs/repeats.py), lines of an unlabelled source while its stream's block is open read
without looking for labels (``Collector.feed_open``), a repeat that no event can be kept of counted at once, lines
that hold only a suspect's words and are not one never handed over (engine.WEAK_WORDS), and quiet lines (none of the
prefilter's words) that an open block does not take, dropped without detect. Logs are built at random from pieces real jobs print, read with the quick paths and
without them (and in small blocks, so that tracebacks straddle the reader's block boundaries): the reports must be
identical."""

from __future__ import annotations

import datetime
import random
from pathlib import Path
from typing import Any

import pytest

from ml_debug.core.output import to_jsonable
from ml_debug.logs import engine, events, readers, repeats, scan
from ml_debug.logs.labels import find_time
from ml_debug.logs.sources import expand
from ml_debug.logs.triage import triage

FRAMES = ('  File "/opt/venv/lib/python3.11/site-packages/urllib3/connection.py", line 466, in getresponse\n'
          "    httplib_response = super().getresponse()\n"
          '  File "/usr/lib/python3.11/socket.py", line 706, in readinto\n'
          "    return self._sock.recv_into(b)\n")
PIECES = [
    # a handled error, logged with its traceback: the same bytes each time
    "{t} [WARNING] data: fetching shard {i:05d} failed, retrying (1/5)\nTraceback (most recent call last):\n" + FRAMES
    + "TimeoutError: The read operation timed out\n\n",
    # the same, its message naming the shard (the bytes differ from one to the next)
    "{t} [WARNING] data: shard {i:05d} failed\nTraceback (most recent call last):\n" + FRAMES
    + "OSError: [Errno 5] Input/output error: '/data/shard_{i:05d}.tar'\n",
    # a launcher's own frames (its mark), then the handled error's
    "{t} [WARNING] retrying\nTraceback (most recent call last):\n"
    '  File "/opt/venv/lib/python3.11/site-packages/accelerate/commands/launch.py", line 1, in main\n'
    "    run()\n" + FRAMES + "OSError: [Errno 5] Input/output error: '/data/shard_{i:05d}.tar'\n",
    # the same traceback, not after a logging record: a failure
    "Traceback (most recent call last):\n" + FRAMES + "TimeoutError: The read operation timed out\n",
    # its message goes on past where the first one ended
    "Traceback (most recent call last):\n" + FRAMES + "TimeoutError: The read operation timed out\n"
    "CUDA kernel errors might be asynchronously reported at some other API call\n",
    # chained
    "Traceback (most recent call last):\n" + FRAMES + "TimeoutError: The read operation timed out\n\n"
    "During handling of the above exception, another exception occurred:\n\nTraceback (most recent call last):\n"
    '  File "/job/train.py", line 9, in <module>\n    main()\nRuntimeError: gave up on shard {i}\n',
    # torch's own prefix, and another writer's lines
    "[rank3]: Traceback (most recent call last):\n[rank3]:   File \"/job/train.py\", line 9, in <module>\n"
    "[rank3]:     main()\n[rank3]: ValueError: bad batch on rank 3\n",
    "\x1b[33m{t} WARNING\x1b[0m retrying\nTraceback (most recent call last):\n" + FRAMES + "TimeoutError: timed out\n",
    "Epoch {i}:  50%|#####     | 5/10 [00:01<00:01, 4.2it/s]\rEpoch {i}: 100%|##########| 10/10\n",
    "node001:4242:4300 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[2] via P2P/IPC/read\n",
    "{t} [INFO] trainer: step {i} | loss 2.1 | lr 3.0e-04\n",
    "{t} [INFO] trainer: step {i} | loss 2.1 | lr 3.0e-04\n",
    # lines with a suspect's words only: a suspect, and a line that is not one
    "{t} checkpoint upload {i} failed\n{t} [INFO] upload of shard {i} failed, retrying\n",
    "\n",
    "    indented text that is no frame {i}\n",
]


def _log(rng: random.Random, n: int, handled: int = 1) -> str:
    """``n`` pieces at random, the handled errors (the first three) ``handled`` times as likely as the rest."""
    out = []
    weights = [handled] * 3 + [1] * (len(PIECES) - 3)
    for i in range(n):
        t = f"2026-11-28 04:{i // 60 % 60:02d}:{i % 60:02d},000"
        out.append(rng.choices(PIECES, weights)[0].format(t=t, i=i))
    return "".join(out)


def _read(paths: list[str]) -> dict[str, Any]:
    """The report, and every event as the reader made it (the report collapses them)."""
    collector, _ = readers.read_all(expand(paths), jobs=1)
    return {"report": to_jsonable(triage(paths, jobs=1)), "events": to_jsonable(collector.events),
            "suspects": to_jsonable(collector.suspects), "dropped": collector.dropped}


def _loud(feed: Any) -> Any:
    """``feed`` told no line is quiet: each goes through detect."""
    return lambda self, raw, line, offset, quiet=False: feed(self, raw, line, offset, False)


def _plain(m: pytest.MonkeyPatch) -> None:
    m.setattr(engine, "_says", lambda *_: True)  # every line with a suspect's words handed over
    m.setattr(repeats, "MAX_FRAMES", 0)
    m.setattr(events.Collector, "feed", _loud(events.Collector.feed))
    m.setattr(events.Collector, "feed_open", lambda *_: False)


@pytest.mark.parametrize("block", [scan.BLOCK, 4096])  # 4 kB: tracebacks straddle the reader's blocks
@pytest.mark.parametrize("seed", range(7))
def test_the_quick_paths_read_what_the_plain_path_reads(seed: int, block: int, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeds 5 and 6 write mostly handled errors: past a writer's MAX_HANDLED_PER_STREAM, repeats are counted."""
    rng = random.Random(seed)
    paths = []
    for k in range(3):
        p = tmp_path / f"rank{k}.log"
        p.write_text(_log(rng, rng.randrange(50, 400), handled=1 if seed < 5 else 20))
        paths.append(str(p))
    monkeypatch.setattr(scan, "BLOCK", block)
    monkeypatch.setattr(scan, "WINDOW", min(scan.WINDOW, block // 4))
    quick = _read(paths)
    with monkeypatch.context() as m:
        _plain(m)
        assert _read(paths) == quick


def test_a_repeat_is_put_back_not_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The quick path is taken: 300 repeats of one handled traceback are read whole once, then put back."""
    log = tmp_path / "rank0.log"
    log.write_text("".join(PIECES[0].format(t=f"2026-11-28 04:00:{i % 60:02d},000", i=i) for i in range(300)))
    calls = []
    real = repeats.replay

    def counted(*args: Any) -> Any:
        got = real(*args)
        calls.append(got > 0)
        return got

    monkeypatch.setattr(scan, "replay", counted)
    collector, _ = readers.read_all(expand([str(log)]), jobs=1)
    assert sum(calls) == 299, calls[:5]
    handled = [e for e in collector.events if e.detail.get("handled")]
    most = events.MAX_HANDLED_PER_STREAM
    assert len(handled) == most and handled[-1].line == (most - 1) * 8 + 2  # each where it is
    assert handled[-1].time == find_time(f"2026-11-28 04:00:{most - 1:02d},000", datetime.date(2026, 11, 28))  # its own
    assert collector.dropped == 300 - most
