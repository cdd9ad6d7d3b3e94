"""TEST-ONLY fault hooks for allreduce-bench, read from ``MLDEBUG_TEST_FAULT``.

They exist so the test suite can prove that the verification pass and the straggler / slow-link
detection find what they claim to find, on real ranks. They are never set by mldebug itself;
a run with a fault hook says so in its notes and summary. Syntax (``;`` separates several):

* ``corrupt:rank=1[,count=3]``: after each verification collective, rank 1 overwrites ``count``
  elements of what it received, as a flaky link or bad memory would.
* ``slow:rank=1[,factor=3]``: rank 1 stays in each timed batch ``factor`` times as long
  (it sleeps inside its own timed region), as a straggler would.
* ``slow-pair:pair=0-1[,factor=3]``: in ``--pairwise``, the exchange between units 0 and 1
  (ranks, or nodes when there are several) takes ``factor`` times as long.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ml_debug.core.errors import UsageError

ENV = "MLDEBUG_TEST_FAULT"


@dataclass(frozen=True)
class Faults:
    corrupt_rank: int | None = None
    corrupt_count: int = 3
    slow_rank: int | None = None
    slow_factor: float = 3.0
    slow_pair: tuple[int, int] | None = None
    slow_pair_factor: float = 3.0
    spec: str = ""

    @property
    def active(self) -> bool:
        return bool(self.spec)


def parse_faults(spec: str | None) -> Faults:
    """Parse a ``MLDEBUG_TEST_FAULT`` value; UsageError on anything malformed."""
    if not spec or not spec.strip():
        return Faults()
    kwargs: dict[str, object] = {"spec": spec.strip()}
    for item in spec.split(";"):
        item = item.strip()
        if not item:
            continue
        kind, _, rest = item.partition(":")
        params: dict[str, str] = {}
        for kv in filter(None, (p.strip() for p in rest.split(","))):
            key, sep, value = kv.partition("=")
            if not sep:
                raise _bad(item)
            params[key.strip()] = value.strip()
        try:
            if kind == "corrupt":
                kwargs["corrupt_rank"] = int(params["rank"])
                kwargs["corrupt_count"] = int(params.get("count", 3))
            elif kind == "slow":
                kwargs["slow_rank"] = int(params["rank"])
                kwargs["slow_factor"] = float(params.get("factor", 3))
            elif kind == "slow-pair":
                a, b = (int(x) for x in params["pair"].split("-"))
                kwargs["slow_pair"] = (min(a, b), max(a, b))
                kwargs["slow_pair_factor"] = float(params.get("factor", 3))
            else:
                raise _bad(item)
        except (KeyError, ValueError):
            raise _bad(item) from None
    return Faults(**kwargs)  # type: ignore[arg-type]


def faults_from_env(environ: Mapping[str, str] | None = None) -> Faults:
    env = os.environ if environ is None else environ
    return parse_faults(env.get(ENV))


def _bad(item: str) -> UsageError:
    return UsageError(f"bad {ENV} entry {item!r}",
                      "test-only hooks: corrupt:rank=R[,count=N]; slow:rank=R[,factor=F]; "
                      "slow-pair:pair=A-B[,factor=F]")
