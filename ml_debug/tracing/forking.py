"""Process life-cycle hooks for active tracers: a forked child gets its own file, ring and
watchdog; exit writes the last dump.

Standard library only: :mod:`ml_debug.nicertrace` imports it into user programs.
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import Protocol


class ForkAware(Protocol):
    def _before_fork(self) -> None: ...

    def _after_fork_child(self) -> None: ...

    def _atexit(self) -> None: ...


# id(tracer) -> a weak reference to it. Not a WeakSet: the hooks run inside the traced program,
# and iterating a WeakSet runs standard-library Python code the tracer would record.
ACTIVE: dict[int, weakref.ref[ForkAware]] = {}
_HOOKS: list[bool] = []


def track(tracer: ForkAware) -> None:
    """Call the tracer's hooks at fork and exit until :func:`untrack`."""
    for key in [k for k, ref in ACTIVE.items() if ref() is None]:
        ACTIVE.pop(key, None)
    ACTIVE[id(tracer)] = weakref.ref(tracer)
    if _HOOKS:
        return
    _HOOKS.append(True)
    atexit.register(_at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_child)


def untrack(tracer: ForkAware) -> None:
    ACTIVE.pop(id(tracer), None)


def _tracked() -> list[ForkAware]:
    return [t for t in (ref() for ref in list(ACTIVE.values())) if t is not None]


def _at_exit() -> None:
    for tracer in _tracked():
        tracer._atexit()


def _before_fork() -> None:
    for tracer in _tracked():
        tracer._before_fork()


def _after_fork_child() -> None:
    for tracer in _tracked():
        tracer._after_fork_child()
