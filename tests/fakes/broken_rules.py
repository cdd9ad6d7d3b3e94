"""A diagnosis broken on purpose: `mldebug logs`' first-failure rule switched off.

Loaded through ``MLDEBUG_TEST_HOOKS=tests.fakes.broken_rules``: every `mldebug logs` run names no
first failure, so `mldebug drill --only crash` must score the drill as missed and exit 1.
"""

from __future__ import annotations

import dataclasses

from ml_debug.logs.result import Verdict


def logs_verdict(verdict: Verdict) -> Verdict:
    return dataclasses.replace(verdict, status="none", summary="no failure found (rule switched off)", primary=None)
