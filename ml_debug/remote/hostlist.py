"""Slurm hostlist expressions, without Slurm: ``node[01-04,07],gpu-a`` <-> a list of names.

Shell equivalents: ``scontrol show hostnames EXPR`` and ``scontrol show hostlist a,b,c``
(both need a readable slurm.conf; without one scontrol retries for about a minute).

Our own small parser rather than python-hostlist because (a) its errors do not say where an
expression is wrong, and a user typing ``--hosts`` deserves that, (b) it drops duplicates and
this module follows ``scontrol show hostnames`` exactly (order and repeats kept; the target
resolver removes repeats itself), and (c) the rules are short: a property test fuzzes this module
against the real ``scontrol`` (tests/test_hostlist_scontrol.py).

Rules (as Slurm 22.05 applies them):

* items are separated by commas outside brackets (whitespace also separates items);
* an item is text with zero or more ``[...]`` groups; several groups give their cartesian
  product (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2);
* text after the last group (``n[1-2]-ib``) is accepted here, as python-hostlist and clush
  accept it, although Slurm 22.05 refuses it; :func:`compress_hostlist` never writes it;
* a group is a comma list of ``N`` or ``LO-HI``; the width of ``LO`` as written sets the zero
  padding of every number in that range (``[08-10]`` -> 08 09 10, ``[8-10]`` -> 8 9 10).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ml_debug.core.errors import UsageError

# A host list is a user typing on a command line; refuse expressions that would expand into a
# number of names no cluster has (a typo like [1-1000000000] must not eat the memory).
MAX_HOSTS = 1_000_000

_HINT = "a hostlist looks like node[01-04,07],gpu-a (ranges inside brackets, items separated by commas)"


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
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise _bad(expr, pos, f"{part!r} is not a number or a LO-HI range")
        lo_s, hi_s = m.group(1), m.group(2)
        if hi_s is None:
            out.append(lo_s)
        else:
            lo, hi = int(lo_s), int(hi_s)
            if hi < lo:
                raise _bad(expr, pos, f"range {lo_s}-{hi_s} goes backwards")
            if hi - lo + 1 > MAX_HOSTS:
                raise _bad(expr, pos, f"range {lo_s}-{hi_s} has more than {MAX_HOSTS} names")
            width = len(lo_s)
            out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
        pos += len(part) + 1
    return out


def _expand_item(expr: str, off: int, item: str) -> list[str]:
    names = [""]
    i = 0
    while i < len(item):
        j = item.find("[", i)
        if j < 0:
            text = item[i:]
            names = [n + text for n in names]
            break
        text = item[i:j]
        k = item.index("]", j)  # _split_top has checked the brackets balance
        numbers = _expand_group(expr, off + j + 1, item[j + 1:k])
        if len(names) * len(numbers) > MAX_HOSTS:
            raise _bad(expr, off + j, f"expands to more than {MAX_HOSTS} names")
        names = [n + text + num for n in names for num in numbers]
        i = k + 1
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


# Slurm 22.05 refuses text after the last bracket group ("Invalid hostlist: n[1-2]-ib"), so only
# a trailing number is compressed: the result must be usable as `srun -w` / `scontrol` input.
_LAST_NUMBER = re.compile(r"^(.*?)(\d+)()$")


def compress_hostlist(names: Iterable[str]) -> str:
    """The shortest-ish expression for a set of names (``scontrol show hostlist a,b,c``).

    Repeats are dropped; names sharing a prefix, suffix and padding collapse into one bracket
    group on their last number, sorted numerically. ``expand_hostlist`` of the result gives the
    same set of names.
    """
    groups: dict[tuple[str, str, int], set[int]] = {}
    plain: set[str] = set()
    order: list[tuple[str, str, int] | str] = []
    for name in names:
        m = _LAST_NUMBER.match(name)
        if not m or "[" in name or "]" in name or "," in name:
            if name not in plain:
                plain.add(name)
                order.append(name)
            continue
        prefix, digits, suffix = m.groups()
        # "007" and "7" are different hosts: padding is part of the group key. A number written
        # without leading zeros gets width 0 so that 8, 9, 10 share one group; a padded group
        # only holds numbers of exactly its width, so its ranges never change length.
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        key = (prefix, suffix, width)
        if key not in groups:
            groups[key] = set()
            order.append(key)
        groups[key].add(int(digits))
    parts: list[str] = []
    for item in sorted(order, key=_sort_key):
        if isinstance(item, str):
            parts.append(item)
            continue
        prefix, suffix, width = item
        numbers = sorted(groups[item])
        if len(numbers) == 1:
            parts.append(f"{prefix}{str(numbers[0]).zfill(width)}{suffix}")
            continue
        ranges: list[str] = []
        lo = prev = numbers[0]
        for n in [*numbers[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            lo_s, hi_s = str(lo).zfill(width), str(prev).zfill(width)
            ranges.append(lo_s if lo == prev else f"{lo_s}-{hi_s}")
            if n is not None:
                lo = prev = n
        parts.append(f"{prefix}[{','.join(ranges)}]{suffix}")
    return ",".join(parts)


def _sort_key(key: tuple[str, str, int] | str) -> tuple[str, str, int]:
    return (key, "", -1) if isinstance(key, str) else key
