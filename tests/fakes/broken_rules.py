"""A diagnosis broken on purpose: dump-stacks' suspect rule switched off.

Loaded through ``MLDEBUG_TEST_HOOKS=tests.fakes.broken_rules``: every dump-stacks run reports no
suspect, so `mldebug drill --only hang` must score the drill as missed and exit 1.
"""

from __future__ import annotations

from typing import Any


def stacks_suspects(suspects: list[Any]) -> list[Any]:
    return []
