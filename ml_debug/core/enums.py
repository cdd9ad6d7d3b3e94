"""The base of mldebug's status vocabularies: enum members that print and serialise as their value."""

from __future__ import annotations

import enum


class Word(str, enum.Enum):
    """A status word: ``f"{Status.PASS}"`` is ``pass`` on every Python (3.11 would print the name)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)
