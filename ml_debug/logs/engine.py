"""The catalogue (catalogue.py) compiled and applied: which lines can matter, which class a failure text is,
which launcher line a line is, which launchers wrote a text.

Prefilter: every needle of the catalogue and the scanner's own words in one Hyperscan database, so one pass
over a block finds the lines that hold any (most lines of a training log hold none; a line with only a
suspect's words, WEAK_WORDS, is kept only when it is one). On the line mixes of benchmarks/bench_logs.py it
runs at grep's speed, where a ``bytes.find`` pass per word cost 8x more and a combined expression in
CPython's ``re`` 24x (docs/commands/logs.md). On a line that passed, one more Hyperscan call says which
needles it holds, and only the patterns holding one of them run: a line costs its few relevant patterns.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import hyperscan

from ml_debug.logs.catalogue import (
    FAILURE_CLASSES,
    LAST_WORK,
    LAUNCHERS,
    NCCL_FINDING_WORDS,
    SCAN_WORDS,
    WATCHDOG,
    WATCHDOG_RANK,
    FailureClass,
    Launcher,
    Line,
)

__all__ = ["LAST_WORK", "WATCHDOG", "WATCHDOG_RANK"]


@dataclass(frozen=True)
class LineRule:
    """A launcher line, compiled."""

    launcher: Launcher
    line: Line
    rx: re.Pattern[str]
    needles: tuple[str, ...]


@dataclass(frozen=True)
class ClassRule:
    """A failure class, compiled."""

    entry: FailureClass
    rx: re.Pattern[str]


LINE_RULES = tuple(LineRule(launcher, line, re.compile(line.pattern), line.needles)
                   for launcher in LAUNCHERS for line in launcher.lines)
CLASS_RULES = tuple(ClassRule(c, re.compile(c.pattern)) for c in FAILURE_CLASSES)
MARKS = tuple((launcher.name, re.compile(launcher.marks), launcher.mark_needles)
              for launcher in LAUNCHERS if launcher.marks and launcher.reported)


def _index(needles: list[tuple[str, ...]]) -> dict[str, tuple[int, ...]]:
    """Each needle: the rules (their positions) that hold it."""
    out: dict[str, tuple[int, ...]] = {}
    for i, words in enumerate(needles):
        for w in words:
            out[w] = out.get(w, ()) + (i,)
    return out


LINE_INDEX = _index([r.needles for r in LINE_RULES])
CLASS_INDEX = _index([r.entry.needles for r in CLASS_RULES])
MARK_INDEX = _index([needles for _, _, needles in MARKS])
_WHICH: dict[tuple[int, frozenset[str]], list[int]] = {}
MAX_WHICH = 4096


def _which(index: dict[str, tuple[int, ...]], present: frozenset[str]) -> list[int]:
    """The rules, in catalogue order, holding one of the ``present`` needles (cached: a log has few sets)."""
    key = (id(index), present)
    got = _WHICH.get(key)
    if got is None:
        if len(_WHICH) >= MAX_WHICH:
            _WHICH.clear()
        got = _WHICH[key] = sorted({i for w in present for i in index.get(w, ())})
    return got


CHECK_WORDS = ("NCCL", "Traceback", "Watchdog caught", "Killed", "rror", "xception", "Exit", "Interrupt", "Fail",
               "Fault")
SUSPECT_WORDS = ("ERROR", "FATAL", "CRITICAL", "ailed", "FAILED", "borted", "core dumped")
DETECT_WORDS = CHECK_WORDS + SUSPECT_WORDS
"""Beside the needles, a literal of all that actions.detect looks for outside the catalogue (its exception,
kill and watchdog checks, the SUSPECT shape's words): a line with none of them nor a needle says nothing."""

SUSPECT = "<suspect>"
NOT_SUSPECT = "<not suspect>"
SHAPES = {
    # a line that looks like a failure but says no more: the last resort when nothing else was found
    SUSPECT: (r"\b(?:ERROR|FATAL|CRITICAL|[Ee]rror|[Ff]ailed|FAILED|[Aa]borted|core dumped)\b", 0),
    # counts of none, and warnings or info lines that mention a failure (torchvision's "UserWarning: Failed to load
    # image Python extension", a retry that worked): a job that printed them may well have succeeded
    # "... thrown while requesting GET ..." (huggingface_hub, then "Retrying in 1s"), "Network error resolved ...,
    # resuming normal operation" (wandb), a C++ exception's stack frame ("frame #0: c10::Error::Error"), a line of
    # a rich traceback's box ("│   242 │ # if the error files for the failed children exist │": source code)
    NOT_SUSPECT: (r"\b(?:0 errors?|no errors?|errors?: 0|error_?rate|failed: 0|without errors?|WARN(?:ING)?|INFO|"
                  r"DEBUG|retry(?:ing)?|resolved|resuming|thrown while requesting)\b|Warning\b|^\[?[IWD]\d{4} |"
                  r"^frame #\d+: |^\s*│", hyperscan.HS_FLAG_CASELESS),
}
"""Shapes of a line, said by the same Hyperscan call as the needles (a line costs one call, where CPython's ``re``
took 3 us for these two alone); a SUSPECT line holds one of DETECT_WORDS too."""
_LEADS = frozenset({*CHECK_WORDS, *LINE_INDEX, *CLASS_INDEX, *MARK_INDEX})


def suspect_at_most(present: frozenset[str]) -> bool:
    """A line with these needles is at most a suspect: no rule of the catalogue, nor a check of detect's, has one
    (``... ERROR: step 12 failed``)."""
    return present.isdisjoint(_LEADS)


def says_nothing(present: frozenset[str]) -> bool:
    """A line with these needles and shapes says nothing to actions.detect: at most a suspect's words, in a line
    that is not one (``... [WARNING] fetching shard 12 failed, retrying``)."""
    return present.isdisjoint(_LEADS) and (NOT_SUSPECT in present or SUSPECT not in present)


class Needles:
    """Which needles and SHAPES a line holds, in one Hyperscan call (1 us; ``in`` per needle costs 16)."""

    def __init__(self) -> None:
        self.words = sorted({*LINE_INDEX, *CLASS_INDEX, *MARK_INDEX, *DETECT_WORDS}) + list(SHAPES)
        rx = [SHAPES.get(w, (re.escape(w), 0)) for w in self.words]
        self._db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        self._db.compile(expressions=[p.encode() for p, _ in rx], ids=list(range(len(rx))), elements=len(rx),
                         flags=[hyperscan.HS_FLAG_SINGLEMATCH | f for _, f in rx])

    def present(self, data: bytes) -> frozenset[str]:
        hits: list[int] = []
        self._db.scan(data, match_event_handler=lambda i, *_: hits.append(i))
        words = self.words
        return frozenset(words[i] for i in hits)


_NEEDLES: Needles | None = None


def needles_of(data: bytes) -> frozenset[str]:
    """The catalogue's needles (and SHAPES) that the UTF-8 ``data`` holds."""
    global _NEEDLES
    if _NEEDLES is None:
        _NEEDLES = Needles()
    return _NEEDLES.present(data)


def needles_in(text: str) -> frozenset[str]:
    """The catalogue's needles (and SHAPES) that ``text`` holds."""
    return needles_of(text.encode("utf-8", "surrogatepass"))


def launcher_lines(text: str, present: frozenset[str] | None = None) -> Iterator[tuple[LineRule, re.Match[str]]]:
    """The launcher lines ``text`` (without labels) matches, in catalogue order (``present``: its needles)."""
    for i in _which(LINE_INDEX, needles_in(text) if present is None else present):
        rule = LINE_RULES[i]
        m = rule.rx.match(text) if rule.line.anchored else rule.rx.search(text)
        if m:
            yield rule, m


def failure_class(text: str, cls: str | None = None, present: frozenset[str] | None = None
                  ) -> tuple[FailureClass, re.Match[str]] | None:
    """The first failure class (of class ``cls``, or any) whose pattern is in ``text``, with its match."""
    for i in _which(CLASS_INDEX, needles_in(text) if present is None else present):
        rule = CLASS_RULES[i]
        if cls is None or rule.entry.cls == cls:
            m = rule.rx.search(text)
            if m:
                return rule.entry, m
    return None


def class_label(entry: FailureClass, m: re.Match[str]) -> str:
    """``entry``'s label, its ``{what}`` the first ``what...`` group of ``m`` that matched."""
    if "{what}" not in entry.label:
        return entry.label
    what = next((g for k, g in m.groupdict().items() if k.startswith("what") and g), "")
    return entry.label.replace("{what}", what.strip())


def marks(text: str, present: frozenset[str] | None = None) -> Iterator[str]:
    """The launchers whose marks are in ``text``."""
    for i in _which(MARK_INDEX, needles_in(text) if present is None else present):
        name, rx, _needles = MARKS[i]
        if rx.search(text):
            yield name


# ----------------------------------------------------------------------------- the prefilter


def scan_words(nccl: bool = True) -> tuple[bytes, ...]:
    """The literals every line that can matter holds one of: the scanner's words and the catalogue's needles
    (without ``nccl``, NCCL's only where they say a finding), not the suspects' WEAK_WORDS."""
    words = set(SCAN_WORDS) if nccl else set(SCAN_WORDS) - {"NCCL"} | set(NCCL_FINDING_WORDS)
    words.update(*(launcher.mark_needles for launcher in LAUNCHERS if launcher.reported),
                 *(r.needles for r in LINE_RULES), *(entry.needles for entry in FAILURE_CLASSES))
    return _shortest(words)


def _shortest(words: set[str]) -> tuple[bytes, ...]:
    """A word that holds another is found by the shorter one: the shortest (fewer matches to report)."""
    out: list[str] = []
    for w in sorted(words, key=len):
        if not any(k in w for k in out):
            out.append(w)
    return tuple(w.encode() for w in sorted(out))


WEAK_WORDS = _shortest(set(SUSPECT_WORDS) - {"core dumped"})
"""The words of a line that only looks like a failure (a suspect). A line with one of them and no other word
of the prefilter is handed over only when it is one (:func:`says_nothing`): most such lines are warnings
(``[WARNING] fetching shard 12 failed, retrying``). "core dumped" is a needle too."""


class Prefilter:
    """One pass over a block for every word: the starts of the lines that hold any."""

    def __init__(self, words: tuple[bytes, ...]) -> None:
        self.words = words
        self._db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        both = self.words + WEAK_WORDS
        n = len(both)
        self._db.compile(expressions=[re.escape(w) for w in both], ids=list(range(n)), elements=n, flags=[0] * n)

    def candidates(self, block: bytes, end: int, start: int = 0, weak: bool = True) -> list[int]:
        """Sorted starts of the lines of ``block[start:end]`` (``start`` a line's start) that hold a word, or
        that hold a weak word and are a suspect (``weak``; without it, every line that holds a weak word: its
        labels may say a suspect's words, as pdsh's host names do)."""
        ends: list[int] = []
        weak_ends: list[int] = []
        strong = len(self.words)

        def hit(i: int, _start: int, to: int, _flags: int, _ctx: object) -> None:
            (ends if i < strong else weak_ends).append(to)

        self._db.scan(block if start == 0 and end == len(block) else block[start:end], match_event_handler=hit)
        starts = self._lines(block, ends, start, end)
        if weak_ends:
            taken = set(starts)
            more = [s for s in self._lines(block, weak_ends, start, end)
                    if s not in taken and (not weak or _says(block, s, end))]
            if more:
                starts = sorted(starts + more)
        return starts

    @staticmethod
    def _lines(block: bytes, ends: list[int], start: int, end: int) -> list[int]:
        """The starts of the lines of ``block[start:end]`` that the match ``ends`` (from ``start``) are on."""
        starts: list[int] = []
        rfind, find = block.rfind, block.find
        nxt = -1  # the end of the last line taken: later hits before it are on the same line
        for to in sorted(ends):
            to += start
            if to <= nxt:
                continue
            starts.append(max(rfind(b"\n", start, to) + 1, start))
            nl = find(b"\n", to - 1, end)
            nxt = nl if nl >= 0 else end
        return starts


T = TypeVar("T")
_ONES = bytes.maketrans(b"23456789", b"11111111")


class ByShape(Generic[T]):
    """A judge of lines whose answers are kept per shape of the line: its digits 1-9 read as 1. The needles,
    SHAPES, labels, logging records and launcher marks name no digit but 0 (they see ``\\d``;
    tests/unit/logs/test_engine.py checks it), so a shape has one answer, and a retry loop's lines, their numbers
    aside, share one. A judge that reads a digit's value (a clock's hour) must not be one."""

    MAX_SHAPES, MAX_SHAPE = 4096, 512

    def __init__(self, judge: Callable[[bytes], T]) -> None:
        self._judge = judge
        self._got: dict[bytes, T] = {}

    def __call__(self, line: bytes) -> T:
        if len(line) > self.MAX_SHAPE:
            return self._judge(line)
        shape = line.translate(_ONES)
        try:
            return self._got[shape]
        except KeyError:
            if len(self._got) >= self.MAX_SHAPES:
                self._got.clear()
            got = self._got[shape] = self._judge(line)
            return got


def _judge(line: bytes) -> bool:
    """The line may say something to actions.detect (not :func:`says_nothing`), or read otherwise once mended
    or stripped (a progress bar's ``\\r`` updates and characters, a final bracket, colour: Collector.feed)."""
    if not line.isascii() or b"\r" in line or b"\x1b" in line or b"%|" in line or line.endswith(b"]"):
        return True
    return not says_nothing(needles_of(line))


_SAYS = ByShape(_judge)


def _says(block: bytes, start: int, end: int) -> bool:
    """Whether the line of ``block`` at ``start`` (its newline before ``end``, or ``end``) may say something."""
    nl = block.find(b"\n", start, end)
    return _SAYS(block[start:nl if nl >= 0 else end])


_PREFILTERS: dict[bool, Prefilter] = {}


def prefilter(nccl: bool = True) -> Prefilter:
    """The process's prefilter, with or without NCCL's ordinary lines (each compiled once: milliseconds)."""
    got = _PREFILTERS.get(nccl)
    if got is None:
        got = _PREFILTERS[nccl] = Prefilter(scan_words(nccl))
    return got
