"""Compressed rank ranges: [0, 1, 2, 5, 7, 8] -> "0-2,5,7-8" (as STAT and Slurm hostlists print them)."""

from __future__ import annotations

from collections.abc import Iterable


def compress(numbers: Iterable[int]) -> str:
    nums = sorted(set(numbers))
    if not nums:
        return ""
    parts: list[str] = []
    start = prev = nums[0]
    for n in nums[1:]:
        if n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = n
    parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def ranks(text: str) -> str:
    """``rank 3`` or ``ranks 0-2,5``, for a :func:`compress` text."""
    return f"rank{'s' if ',' in text or '-' in text else ''} {text}"


def expand(text: str) -> list[int]:
    """The inverse of :func:`compress`."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, sep, hi = part.partition("-")
        out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return out
