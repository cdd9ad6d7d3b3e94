"""The catalogue's patterns are linear in the line's length, and the prefilter finds every line that can matter.

Linear: each pattern searches lines of 1 kB, 10 kB and 1 MB that it does not match (built of its own
needles, which start a match that then fails, and of ordinary text). Linear, 10x the line costs ~10x and
100x costs ~100x; a pattern that backtracks over the rest of the line from each start costs 100x and
10,000x (DeepSpeed's old exit pattern took 0.7 s on 10 kB). The times are the best of a few runs (noise only
adds), and the bounds are loose (30x, 3,000x): ratios of work, never a time.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from ml_debug.logs import actions, blocks, engine, text
from ml_debug.logs.catalogue import LAST_WORK, WATCHDOG, WATCHDOG_RANK
from tests.conftest import REPO

TINY, SMALL, LARGE = 1_000, 10_000, 1_000_000
BOUND = 3000  # linear: ~100 (up to a few hundred when 1 MB leaves the cache); super-linear: ~10,000
ORDINARY = ("/opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:91: UserWarning: None of the inputs "
            "have requires_grad=True. Gradients will be None [rank3]: (12) 0x7f: ")


def _patterns() -> list[tuple[str, re.Pattern[str], tuple[str, ...]]]:
    out = [(f"line {r.launcher.name}/{r.line.action}", r.rx, r.needles) for r in engine.LINE_RULES]
    out += [(f"class {r.entry.label}", r.rx, r.entry.needles) for r in engine.CLASS_RULES]
    out += [(f"mark {name}", rx, needles) for name, rx, needles in engine.MARKS]
    out += [("watchdog", re.compile(WATCHDOG), ("Watchdog caught collective operation timeout: WorkNCCL(",)),
            ("watchdog rank", re.compile(WATCHDOG_RANK), ("[PG 0 ",)), ("last work", re.compile(LAST_WORK), ())]
    # the collector's own patterns run on every candidate line too
    out += [("inline exception", actions._INLINE_EXCEPTION, ("Error: ", "a.b.")),
            ("^exception line", blocks.EXCEPTION_TYPE, ("Error",)), ("^exception name", text.EXCEPTION_LINE, ("a.",))]
    out += [(f"^{name}", rx, needles) for name, rx, needles in out if name.startswith("line ") and
            next(r for r in engine.LINE_RULES if r.rx is rx).line.anchored]
    return out


PATTERNS = _patterns()


def _best(rx: re.Pattern[str], line: str, runs: int, anchored: bool) -> float:
    run = rx.match if anchored else rx.search
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        run(line)
        best = min(best, time.perf_counter() - t0)
    return best


def _ratio(rx: re.Pattern[str], short: str, long: str, anchored: bool, bound: float) -> float:
    """The cost of ``long`` over ``short``'s: the lowest of up to 3 rounds, a round more only while it is over
    ``bound`` (on a busy machine one round's best may still hold a pause: noise only adds, so a linear pattern's
    ratio falls back under the bound, a super-linear one's never does)."""
    ratio = float("inf")
    for _ in range(3):
        t_short = _best(rx, short, 7, anchored)
        ratio = min(ratio, _best(rx, long, 5 if len(long) <= SMALL else 3, anchored) / max(t_short, 1e-7))
        if ratio < bound:
            break
    return ratio


def _fillers(needles: tuple[str, ...]) -> list[str]:
    # a needle cut short of what follows it in a match ("failed (exitcode: " then no digits), and ordinary text
    return [n + " " for n in needles[:2]] + [ORDINARY, "a" * 50 + ".", "[" * 20 + "(" * 20 + ": " * 10]


@pytest.mark.parametrize("name", [p[0] for p in PATTERNS])
def test_every_pattern_is_linear_in_the_line(name: str) -> None:
    _, rx, needles = next(p for p in PATTERNS if p[0] == name)
    anchored = name.startswith("^")  # used with match (from the line's start), as the code does
    find = rx.match if anchored else rx.search
    tried = 0
    for unit in _fillers(needles):
        tiny = (unit * (TINY // len(unit) + 1))[:TINY]
        small = tiny * (SMALL // TINY)
        if find(small):
            continue  # a line it matches says nothing about the cost of a line it does not
        ratio = _ratio(rx, tiny, small, anchored, 30)
        assert ratio < 30, f"{name}: 10x the line costs {ratio:.0f}x ({unit[:30]!r})"
        large = small * (LARGE // SMALL)
        if find(large):
            continue
        ratio = _ratio(rx, small, large, anchored, BOUND)
        assert ratio < BOUND, f"{name}: 100x the line costs {ratio:.0f}x ({unit[:30]!r})"
        tried += 1
    assert tried, f"{name}: every filler matched"


def test_the_prefilter_finds_the_lines_that_hold_a_word_and_no_other() -> None:
    words = engine.scan_words()
    assert b"Traceback" in words and b"NCCL" in words and b"failed (exitcode:" not in words  # "exitcode" finds it
    data = b"plain\nx Traceback y\nplain again\nfoo failed (exitcode: 1)\nNCCL INFO x\nlast\n"
    starts = engine.prefilter().candidates(data, len(data))
    assert [data[s:data.index(b"\n", s)] for s in starts] == [b"x Traceback y", b"foo failed (exitcode: 1)",
                                                              b"NCCL INFO x"]
    # past a source's first NCCL lines, only their findings
    quiet = engine.prefilter(nccl=False).candidates(data + b"h:1:1 [0] NCCL INFO NET/IB : No device found.\n",
                                                      len(data) + 46)
    assert len(quiet) == 3, quiet


WARNING_LINE = b"2025-03-02 01:00:00,550 [WARNING] data: fetching shard 00001 failed, retrying (1/5)"


@pytest.mark.parametrize("line, handed", [
    (WARNING_LINE, False),  # a warning that mentions a failure: not even a suspect
    (b"I0302 01:00:00.550 123 loader.py:88] shard 00001 failed", False),  # absl's INFO
    (b"upload of checkpoint 12 failed", True),  # a suspect
    (b"FATAL: cannot continue, the dataset is gone", True),
    (b"ERROR: job aborted by the operator", True),
    (b"[WARNING] Failed to load image Python extension", True),  # "Fail" is one of detect's checks
    (b"2025-03-02 01:00:00 [WARNING] shard 1 failed: OSError: [Errno 5] Input/output error", True),  # "rror"
    (b"\x1b[33m[WARNING]\x1b[0m job failed", True),  # colour: read once its escapes are stripped
    (b"shard 7 failed, retrying \xe2\x94\x81\xe2\x94\x81", True),  # a bar's characters: mended first
    (b"[rank3]: step 12 failed [retry]", True),  # a bracket at its end: mended first
])
def test_a_line_that_holds_only_a_suspects_words_is_handed_over_when_it_is_a_suspect(line: bytes,
                                                                                      handed: bool) -> None:
    data = b"plain\n" + line + b"\nplain\n"
    starts = engine.prefilter().candidates(data, len(data))
    assert (starts == [6]) is handed, starts
    # without ``weak`` (pdsh's sources: a host name may say "WARN" or "debug"), every such line is
    assert engine.prefilter().candidates(data, len(data), weak=False) == [6]


def test_what_is_judged_by_shape_names_no_digit_but_0() -> None:
    """engine.ByShape reads a line's digits 1-9 as 1: sound while no needle, shape, label, logging record or
    launcher mark pattern names one (a quantifier's count aside)."""
    from ml_debug.logs import labels
    needles = engine.Needles()
    patterns = [w for w in needles.words if w not in engine.SHAPES] + [p for p, _ in engine.SHAPES.values()]
    patterns += [blocks.LOGGED.pattern] + [v.pattern for v in vars(labels).values() if isinstance(v, re.Pattern)]
    patterns += [rx.pattern for _, rx, _ in engine.MARKS]  # blocks._FRAME_MARKS
    named = [p for p in patterns if re.search(r"[1-9]", re.sub(r"\{\d+(?:,\d*)?\}|\\x[0-9a-f]{2}", "", p))]
    assert not named


def test_lines_of_one_shape_are_judged_alike() -> None:
    calls: list[bytes] = []
    judge = engine.ByShape(lambda line: calls.append(line) or len(calls))
    assert judge(b"shard 12 failed: 0 errors") == judge(b"shard 98 failed: 0 errors") == 1
    assert judge(b"shard 12 failed: 10 errors") == 2  # 0 is its own digit
    assert judge(b"x" * 600) == 3 and judge(b"x" * 600) == 4  # a long line is judged each time, not kept


def test_past_a_sources_first_nccl_lines_only_their_findings_and_failures_are_read(tmp_path: Path) -> None:
    """A job that makes a communicator every step: its NCCL lines past the first NCCL_LINES_PER_SOURCE are
    skipped, in the same 1 MiB block too, but NCCL's findings (no IB device, sockets) and a failure after them
    are read."""
    from ml_debug.logs.catalogue import NCCL_LINES_PER_SOURCE
    from ml_debug.logs.triage import triage

    old = (REPO / "tests" / "data" / "logs" / "nccl_old_format.log").read_text().splitlines()
    channel = next(ln for ln in old if " Channel " in ln or " Ring " in ln)
    no_ib = next(ln for ln in old if "No device found" in ln)
    body = "\n".join([channel] * (NCCL_LINES_PER_SOURCE * 3)) + "\n"
    path = tmp_path / "rank3.log"
    path.write_text(body + no_ib + "\n" + body + "Traceback (most recent call last):\n"
                    '  File "/job/train.py", line 3, in <module>\nValueError: bad batch\n')
    report = triage([str(path)])
    assert report.verdict.primary is not None and report.verdict.primary.message == "ValueError: bad batch"
    hosts = (report.nccl or {}).get("hosts", [])
    assert [h["host"] for h in hosts if h.get("no_ib_device")] == ["ip-10-0-1-17"], report.nccl
    assert (report.nccl or {})["lines"] < NCCL_LINES_PER_SOURCE * 2, report.nccl  # the rest were skipped
