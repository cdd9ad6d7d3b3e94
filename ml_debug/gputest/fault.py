"""TEST-ONLY fault hook for `mldebug gpu-test` (never set it on a real job).

``MLDEBUG_TEST_FAULT="<kind>:rank=R[:stage=S]"`` (or ``device=D`` for the device/member index of an
``--isolate`` sub-run) makes the matching rank misbehave on purpose, so the tests can prove the
verdict names the right rank:

- ``wrong-value``: contribute rank+1+1000 to the all_reduce instead of rank+1;
- ``die``: SIGKILL itself when stage S starts (default all_reduce);
- ``hang``: sleep forever when stage S starts (its own watchdog ends it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ml_debug.core.errors import UsageError

ENV = "MLDEBUG_TEST_FAULT"
KINDS = ("wrong-value", "die", "hang")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int | None = None
    device: int | None = None
    stage: str = "all_reduce"

    def applies(self, rank: int, device_id: int | None) -> bool:
        if self.rank is not None and self.rank != rank:
            return False
        return self.device is None or self.device == device_id


def parse(spec: str | None) -> Fault | None:
    """Parse the hook's value; None when unset."""
    if not spec:
        return None
    kind, *parts = spec.strip().split(":")
    if kind not in KINDS:
        raise UsageError(f"{ENV}={spec!r}: unknown fault {kind!r}", f"one of {', '.join(KINDS)} (test-only hook)")
    fields: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or key not in ("rank", "device", "stage"):
            raise UsageError(f"{ENV}={spec!r}: bad field {part!r}", "e.g. wrong-value:rank=1 or die:rank=1:stage=broadcast")
        fields[key] = value
    try:
        return Fault(kind, int(fields["rank"]) if "rank" in fields else None,
                     int(fields["device"]) if "device" in fields else None, fields.get("stage", "all_reduce"))
    except ValueError:
        raise UsageError(f"{ENV}={spec!r}: rank/device must be integers", "e.g. wrong-value:rank=1") from None


def active(rank: int, device_id: int | None) -> Fault | None:
    """The fault this rank must inject, if the test hook targets it."""
    fault = parse(os.environ.get(ENV))
    return fault if fault is not None and fault.applies(rank, device_id) else None
