"""Slurm hostlist expressions, without Slurm: ``node[01-04,07],gpu-a`` <-> a list of names.

Shell equivalents: ``scontrol show hostnames EXPR`` and ``scontrol show hostlist a,b,c``
(both need a readable slurm.conf; without one scontrol retries for about a minute).

Our own small parser rather than python-hostlist because (a) its errors do not say where an
expression is wrong, and a user typing ``--hosts`` deserves that, (b) it drops duplicates and
this module follows ``scontrol show hostnames`` exactly (order and repeats kept; the target
resolver removes repeats itself), and (c) the rules are short: property tests fuzz this module
against the real ``scontrol`` (tests/rig/test_hostlist_scontrol.py).

Rules (as Slurm 22.05 applies them):

* items are separated by commas outside brackets (whitespace also separates items);
* an item is text with zero or more ``[...]`` groups; several groups give their cartesian
  product, in Slurm's order: the last group varies fastest, then the first, the second, ...,
  and the one before the last varies slowest (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2;
  ``[1-2][1-2][1-2]`` -> 111 112 211 212 121 122 221 222);
* text after the last group (``n[1-2]-ib``) is accepted here, as python-hostlist and clush
  accept it, although Slurm 22.05 refuses it; :func:`compress_hostlist` never writes it;
* a group is a comma list of ``N`` or ``LO-HI`` in ASCII digits; the width of ``LO`` as written
  sets the zero padding of every number in that range (``[08-10]`` -> 08 09 10, ``[8-10]`` ->
  8 9 10); one range holds at most 65536 names ("Too many hosts in range", as Slurm says).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ml_debug.core.errors import UsageError

# Slurm refuses a single LO-HI range of more than 64Ki names (MAX_RANGE in its hostlist.c).
MAX_RANGE = 65536
# Slurm has no limit on a whole expression (a[1-1000]b[1-1000] gives a million names); this
# one is ours: a typo must not eat the memory of the machine a user types --hosts on.
MAX_HOSTS = 1_000_000

_HINT = "a hostlist looks like node[01-04,07],gpu-a (ranges inside brackets, items separated by commas)"
_RANGE = re.compile(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?")


def _bad(expr: str, pos: int, why: str) -> UsageError:
    return UsageError(f"bad hostlist {expr!r} at character {pos + 1}: {why}", _HINT)


def _split_top(expr: str) -> list[tuple[int, str]]:
    """Split at commas/whitespace outside brackets; returns (offset, item) pairs."""
    items: list[tuple[int, str]] = []
    depth, start = 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            if depth:
                raise _bad(expr, i, "nested '['")
            depth = 1
        elif ch == "]":
            if not depth:
                raise _bad(expr, i, "']' without '['")
            depth = 0
        elif (ch == "," or ch.isspace()) and not depth:
            items.append((start, expr[start:i]))
            start = i + 1
    if depth:
        raise _bad(expr, expr.rindex("["), "'[' is never closed")
    items.append((start, expr[start:]))
    return [(off, item) for off, item in items if item]


def _expand_group(expr: str, off: int, body: str) -> list[str]:
    """The numbers of one bracket group, as strings with their padding."""
    if not body.strip():
        raise _bad(expr, off, "empty brackets")
    out: list[str] = []
    pos = off
    for part in body.split(","):
        m = _RANGE.fullmatch(part)
        if not m:
            # str.isdigit() is true for Arabic-Indic, fullwidth, ... digits, which Slurm (C
            # isdigit) does not read as numbers: say so rather than "not a number".
            odd = next((ch for ch in part if ch.isdigit() and not ch.isascii()), None)
            if odd is not None:
                raise _bad(expr, pos + part.index(odd),
                           f"{odd!r} is a non-ASCII digit; hostlist numbers are written with 0-9")
            raise _bad(expr, pos, f"{part!r} is not a number or a LO-HI range")
        lo_s, hi_s = m.group(1), m.group(2)
        if hi_s is None:
            out.append(lo_s)
        else:
            lo, hi = int(lo_s), int(hi_s)
            if hi < lo:
                raise _bad(expr, pos, f"range {lo_s}-{hi_s} goes backwards")
            if hi - lo + 1 > MAX_RANGE:
                raise _bad(expr, pos, f"Too many hosts in range {lo_s}-{hi_s} ({hi - lo + 1} names; "
                                      f"Slurm takes at most {MAX_RANGE} in one range)")
            width = len(lo_s)
            out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
        pos += len(part) + 1
    return out


def _expand_item(expr: str, off: int, item: str) -> list[str]:
    texts: list[str] = []  # the text before each group, then the text after the last one
    groups: list[list[str]] = []
    i = 0
    while (j := item.find("[", i)) >= 0:
        k = item.index("]", j)  # _split_top has checked the brackets balance
        texts.append(item[i:j])
        groups.append(_expand_group(expr, off + j + 1, item[j + 1:k]))
        i = k + 1
    texts.append(item[i:])
    if not groups:
        return [item]
    count = 1
    for numbers in groups:
        count *= len(numbers)
    if count > MAX_HOSTS:
        raise _bad(expr, off, f"expands to more than {MAX_HOSTS} names")
    # Slurm's order: the group before the last varies slowest, down to the first, and the last
    # group varies fastest. product() varies its last argument fastest.
    n = len(groups)
    order = [*range(n - 2, -1, -1), n - 1]
    names: list[str] = []
    values = [""] * n
    for combo in itertools.product(*(groups[g] for g in order)):
        for g, value in zip(order, combo, strict=True):
            values[g] = value
        names.append(texts[0] + "".join(v + t for v, t in zip(values, texts[1:], strict=True)))
    return names


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist expression into host names (``scontrol show hostnames EXPR``).

    Order and repeats are kept as scontrol keeps them. Raises UsageError naming the position of
    the first mistake.
    """
    if not expr or not expr.strip():
        raise UsageError("empty hostlist", _HINT)
    names: list[str] = []
    for off, item in _split_top(expr):
        names.extend(_expand_item(expr, off, item))
        if len(names) > MAX_HOSTS:
            raise _bad(expr, off, f"expands to more than {MAX_HOSTS} names")
    if not names:
        raise UsageError(f"hostlist {expr!r} names no host", _HINT)
    return names


# Only a trailing run of ASCII digits is a host number (Slurm 22.05 refuses text after the last
# bracket group, so "n1-ib" stays a plain name: the result must be valid `srun -w` input).
_TRAILING_NUMBER = re.compile(r"^(.*?)([0-9]+)$", re.DOTALL)


@dataclass
class _Range:
    prefix: str
    lo: int
    hi: int
    width: int  # digits printed, zero padded; a name with no number has width -1

    def numbers(self) -> str:
        lo = str(self.lo).zfill(self.width)
        return lo if self.lo == self.hi else f"{lo}-{str(self.hi).zfill(self.width)}"


def _pad(num: int, width: int) -> int:
    """Zeros printed before `num` at this width."""
    return max(width - len(str(num)), 0)


def _joinable(tail: _Range, num: int, width: int) -> bool:
    """Can host `num` (written `width` digits wide) extend `tail`, and at which width?

    Two widths are one when writing both numbers at either of them leaves one number's padding
    unchanged (08..10 at width 2; 8..10 at width 1; 099..100 at width 3), the rule Slurm applies
    when it builds a hostlist. The range keeps its width when the other side is the one that
    would change; otherwise it takes the new host's.
    """
    if tail.width < 0 or tail.hi + 1 != num:
        return False
    if tail.width == width:
        return True
    tail_same = _pad(tail.lo, tail.width) == _pad(tail.lo, width)
    new_same = _pad(num, width) == _pad(num, tail.width)
    if not tail_same and not new_same:
        return False
    if tail_same:
        tail.width = width
    return True


def compress_hostlist(names: Iterable[str]) -> str:
    """The expression for a set of names (``scontrol show hostlist a,b,c`` of them, sorted).

    Repeats are dropped and the names sorted by prefix, then number; then they are folded as
    Slurm folds them: a host joins the range before it when its prefix is the same, its number
    is the next one and its zero padding fits, and consecutive ranges sharing a prefix share one
    bracket. So ``scontrol show hostlist`` of the expanded result writes this same string, and
    ``expand_hostlist`` of it gives each name once.
    """
    hosts: set[tuple[str, int, int]] = set()
    for name in names:
        if not name:
            continue
        m = _TRAILING_NUMBER.match(name)
        if m:
            hosts.add((m.group(1), int(m.group(2)), len(m.group(2))))
        else:
            hosts.add((name, 0, -1))
    ranges: list[_Range] = []
    # Plain names (width -1) sort before numbered ones of the same prefix; among equal numbers
    # the narrower padding comes first (7 before 007).
    for prefix, num, width in sorted(hosts, key=lambda h: (h[0], h[2] >= 0, h[1], h[2])):
        tail = ranges[-1] if ranges else None
        if width >= 0 and tail is not None and tail.prefix == prefix and _joinable(tail, num, width):
            tail.hi = num
        else:
            ranges.append(_Range(prefix, num, num, width))
    parts: list[str] = []
    i = 0
    while i < len(ranges):
        first = ranges[i]
        if first.width < 0:
            parts.append(first.prefix)
            i += 1
            continue
        j = i + 1
        while j < len(ranges) and ranges[j].width >= 0 and ranges[j].prefix == first.prefix:
            j += 1
        body = ",".join(r.numbers() for r in ranges[i:j])
        parts.append(f"{first.prefix}{body}" if j == i + 1 and first.lo == first.hi
                     else f"{first.prefix}[{body}]")
        i = j
    return ",".join(parts)
