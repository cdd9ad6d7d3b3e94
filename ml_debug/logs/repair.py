"""Logs as people paste them: quoted, indented, numbered, wrapped, reversed, glued to progress bars; mended before
reading.

- Damage of the whole text, found by :func:`sniff` in a source's first ``SNIFF_BYTES`` and undone by
  :func:`mend` (a pasted log is small; a source over ``MEND_LIMIT`` is read as it is): markdown quoting, an
  indentation in front of every line, a viewer's line numbers, lines hard-wrapped by a terminal at a fixed
  width, a log pasted bottom-to-top; and pdsh's node names in front of every line (read as labels).
- Damage of one line, undone by :func:`mend_line` on the lines the scanner hands over: a tqdm or rich progress
  bar a log line was glued onto (no newline after the bar, or a carriage return), tmux's scrollback counter
  (``[12/3456]``) glued onto the end.

What was mended is said per source (``SourceInfo.repairs``): the text was not read as is.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections import Counter
from dataclasses import dataclass, field

from ml_debug.logs.blocks import TRACEBACK
from ml_debug.logs.labels import NODE_PREFIX, find_time

SNIFF_BYTES = 16 << 10
MEND_LIMIT = 64 << 20
# "  12 | text", "12: text", "12<tab>text", "[12] text"
_NUMBERED = re.compile(r"^(?:\s{0,6}(\d{1,7})(?:\s*[|│:]\s?|\t| {1,2})|\[(\d{1,7})\] )")
_FRAME = re.compile(r'(?:^|\s|\]: ?)File "')
_NOT_A_NODE = re.compile(r"(?:Error|Exception|Warning|Traceback|INFO|WARN|WARNING|ERROR|DEBUG|NOTE|Note|http|https)$")
# tqdm: "Epoch 1:  12%|█▏        | 12/100 [00:01<00:08, 10.50it/s, loss=0.5]"; rich (Lightning): "Epoch 0/0 ━━━╸  2/8
# 0:00:05 • 0:00:01 160.41it/s"
_TQDM = re.compile(r"^.{0,200}?\d{1,3}%\|[^|]{0,200}\|[^\[\n]{0,60}\[[^\]\n]{0,200}\]")
_RICH = re.compile(r"^.{0,200}?[━╸╺]+.{0,120}(?:\d+(?:\.\d+)?(?:it/s|s/it)|\d+:\d\d:\d\d) ?")
_TMUX = re.compile(r"(?<=\S)\[\d+/\d+\]\s*$")
# torchrun's failure summary: rules as wide as its widest line, and its entries' fields
_TABLE_LINE = re.compile(r"\s*(?:[=\-*]+|(?:time|host|rank|exitcode|error_file|traceback|msg)\s*:.*)$")


@dataclass
class Damage:
    """What :func:`sniff` found in a source's first bytes."""

    quoted: bool = False
    indent: int = 0
    """Spaces in front of every line (a paste indented as a markdown code block)."""
    numbered: bool = False
    wrap_width: int | None = None
    reversed: bool = False
    node_prefix: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def whole(self) -> bool:
        """The whole text must be mended before it is read."""
        return self.quoted or bool(self.indent) or self.numbered or self.wrap_width is not None or self.reversed


def _indent(lines: list[str]) -> int:
    """The spaces in front of every line that is not blank, when there are 2 or more (a paste indented as a markdown
    code block, or inside a quoted reply): no program writes every line so."""
    body = [ln for ln in lines if ln.strip()]
    least = min((len(ln) - len(ln.lstrip(" ")) for ln in body), default=0)
    return least if least >= 2 else 0


def _quoted(lines: list[str]) -> bool:
    """Markdown quoting: most of the lines that are not blank start with ``>``."""
    body = [ln for ln in lines if ln.strip()]
    return sum(1 for ln in body if ln.startswith(">")) >= 0.8 * len(body)


def _unquote(lines: list[str]) -> list[str]:
    return [re.sub(r"^(?:> ?)+", "", ln) for ln in lines]


def _numbered(lines: list[str]) -> bool:
    """A viewer's line numbers (``  12 | text``, ``12: text``, ``[12] text``): the lines that are not blank start with
    numbers that mostly go up by one."""
    nums = [int(m.group(1) or m.group(2)) if (m := _NUMBERED.match(ln)) else None for ln in lines if ln.strip()]
    if len(nums) < 5 or None in nums[:3]:
        return False
    steps = sum(1 for a, b in zip(nums, nums[1:], strict=False) if a is not None and b == a + 1)
    return steps >= 0.8 * (len(nums) - 1)


def _unnumber(lines: list[str]) -> list[str]:
    return [ln[m.end():] if (m := _NUMBERED.match(ln)) else ln for ln in lines]


def _wrap_width(lines: list[str], complete: bool) -> int | None:
    """The width a terminal hard-wrapped these lines at, or None: many lines of exactly the longest length,
    none longer. The last line (maybe cut) is left out unless ``complete``."""
    usable = lines if complete else lines[:-1]
    body = [len(ln) for ln in usable if ln.strip()]
    if len(body) < 4:
        return None
    width = max(body)
    at = body.count(width)
    if width < 40 or at < 3 or at < 0.05 * len(body) or Counter(body).most_common(1)[0][1] >= 0.9 * len(body):
        return None  # too few of that width, or a table of equal-width lines (not wrapped)
    # a wrapped line goes on in the next, which does not start like the source's lines start (a label, a
    # time stamp), nor like the line itself: lines of a fixed format that happen to be the longest are not wrapped
    # (gloo's "[.../debug_logger.cc:9] ERROR failed to connect, willRetry=1, retry=1, ..." lines, one per retry)
    starts = Counter(ln[:4] for ln in usable if ln.strip())
    common = {s for s, n in starts.items() if n >= 0.2 * len(body)}
    full = [i for i, ln in enumerate(usable) if len(ln) == width and i + 1 < len(usable)]
    if len({usable[i] for i in full if not _TABLE_LINE.match(usable[i])}) < 3:
        return None  # a table at its widest (torchrun's summary: its rules, each entry's traceback hint), no wrap
    goes_on = sum(1 for i in full if usable[i + 1][:4] not in common and usable[i + 1][:8] != usable[i][:8])
    return width if goes_on >= 0.7 * len(full) else None


def _unwrap(lines: list[str], width: int) -> list[str]:
    """Each line of exactly ``width`` joined to the next."""
    out: list[str] = []
    buf = ""
    for ln in lines:
        buf += ln
        if len(ln) != width:
            out.append(buf)
            buf = ""
    return out + [buf] if buf else out


def _is_reversed(lines: list[str]) -> bool:
    """Tracebacks read upside down (their header after their frames), or time stamps going back."""
    forward = backward = 0
    for i, ln in enumerate(lines):
        if TRACEBACK in ln:
            if i + 1 < len(lines) and _FRAME.search(lines[i + 1]):
                forward += 1
            elif i and _FRAME.search(lines[i - 1]):
                backward += 1
    if forward or backward:
        return backward > forward
    day = _dt.date.today()
    picked = lines[::max(1, len(lines) // 40)]  # a few dozen lines say which way time goes
    up = down = 0
    prev: float | None = None
    for i, ln in enumerate(picked):
        t = find_time(ln[:60], day)
        if t is None:
            continue
        if prev is not None:
            up += t > prev
            down += t < prev
        prev = t
        if down + len(picked) - 1 - i <= 3 * up:  # the rest cannot turn it: most logs stop after a few lines
            return False
    return down >= 3 and down > 3 * up


def _node_prefixed(lines: list[str]) -> bool:
    """pdsh's ``node12: `` in front of most lines (a few distinct names, none an exception's or a level's)."""
    body = [ln for ln in lines if ln.strip()]
    if len(body) < 3:
        return False
    names: Counter[str] = Counter()
    misses, most = 0, 0.3 * len(body)
    for ln in body:
        m = NODE_PREFIX.match(ln)
        if m and not _NOT_A_NODE.search(m.group(1)) and not m.group(1).startswith(("pdsh", "srun")):
            names[m.group(1)] += 1
        else:
            misses += 1
            if misses > most:  # fewer than 70% can be prefixed now
                return False
    return sum(names.values()) >= 0.7 * len(body) and len(names) <= max(2, len(body) // 4)


def _lines(data: bytes) -> list[str]:
    """The lines of ``data``, without the empty one after its last newline (bytes that are not UTF-8 kept as they
    are: mend gives them back)."""
    lines = data.decode("utf-8", "surrogateescape").split("\n")
    if not lines[-1]:
        lines.pop()
    return lines


def sniff(head: bytes) -> Damage:
    """The damage the first bytes of a source show: its first SNIFF_BYTES, whatever the source's size (a sample
    that stops inside a line ends at the line before)."""
    d = Damage()
    sample = head[:SNIFF_BYTES]
    whole = len(head) <= SNIFF_BYTES  # the sample is all there is (of the source, or of a short block)
    if not whole:
        sample = sample[:sample.rfind(b"\n") + 1] or sample
    lines = _lines(sample)
    if not any(ln.strip() for ln in lines):
        return d
    if _quoted(lines):
        d.quoted = True
        lines = _unquote(lines)
    first = next((ln for ln in lines if ln.strip()), "")
    if _NUMBERED.match(first) and _numbered(lines):
        d.numbered = True
        lines = _unnumber(lines)
        if _quoted(lines):
            d.quoted = True  # numbers outside the quoting
            lines = _unquote(lines)
    d.indent = _indent(lines)
    lines = [ln[d.indent:] for ln in lines]
    # only a line ending in "]" can end in a tmux counter: the others skip the regular expression
    lines = [_TMUX.sub("", ln) if ln.rstrip().endswith("]") else ln for ln in lines]
    d.wrap_width = _wrap_width(lines, whole)
    if d.wrap_width:
        lines = _unwrap(lines, d.wrap_width)
    d.reversed = _is_reversed(lines)
    d.node_prefix = _node_prefixed([mend_line(ln)[0][-1] if "\r" in ln or "%|" in ln or "━" in ln else ln
                                    for ln in lines])
    return d


def mend(data: bytes, d: Damage) -> bytes:
    """The whole text with the damage ``d`` undone; ``d.notes`` says what was done."""
    lines = _lines(data)
    if d.quoted:
        lines = _unquote(lines)
        d.notes.append("markdown quoting ('> ') removed")
    if d.numbered:
        lines = _unnumber(lines)
        d.notes.append("viewer line numbers removed")
        if d.quoted and any(ln.startswith(">") for ln in lines[:5]):
            lines = _unquote(lines)
    if d.indent:
        lines = [ln[d.indent:] if ln[:d.indent].isspace() else ln for ln in lines]
        d.notes.append(f"an indentation of {d.indent} spaces on every line removed")
    if d.wrap_width:
        lines = [_TMUX.sub("", ln) for ln in lines]
        joined = sum(len(ln) == d.wrap_width for ln in lines)
        lines = _unwrap(lines, d.wrap_width)
        d.notes.append(f"{joined} line(s) hard-wrapped at {d.wrap_width} columns rejoined")
    if d.reversed:
        lines.reverse()
        d.notes.append("pasted bottom-to-top: read in reverse")
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


def mend_line(text: str) -> tuple[list[str], str | None]:
    """One line's text, a progress bar or tmux counter glued to it cut off: (the lines it holds, what was cut, or
    None when nothing was glued to anything: a bar alone on its line is no damage)."""
    what = None
    parts = [p for p in text.split("\r") if p.strip()] if "\r" in text else [text]
    out = []
    for p in parts:
        if "%|" in p or "━" in p or "╸" in p:
            m = (_TQDM.match(p) if "%|" in p else None) or _RICH.match(p)
            if m:
                rest = p[m.end():]
                if not rest.strip():
                    continue
                p = rest.lstrip()
                what = "progress bar"
        if p.endswith("]") and _TMUX.search(p):
            p = _TMUX.sub("", p)
            what = what or "tmux counter"
        out.append(p)
    if len(out) > 1:
        what = what or "carriage return"
    return (out or [""]), what
