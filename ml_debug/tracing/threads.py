"""NicerTrace's per-thread state: the thread's tag, its ring, and the functions that record its events.

Standard library only: :mod:`ml_debug.nicertrace` imports it into user programs.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

WATCHDOG_NAME = "mldebug-nicertrace-watchdog"
WATCHDOG_TAG = "{" + WATCHDOG_NAME + "} "


def thread_tag(ident: int) -> str | None:
    """``"{name} "`` for a registered thread, None while threading does not know it yet.

    Reads threading's registry without calling into it (the dump path must stay untraced).
    """
    thread = threading._active.get(ident)  # type: ignore[attr-defined]
    if thread is None:
        return None
    return "{" + str(thread._name).replace("}", ")") + "} "


class ThreadState:
    """One traced thread. The backends call ``emit_call`` / ``emit_line`` (None: write nothing,
    counting only) and install ``localtrace`` (sys.settrace) for its frames."""

    __slots__ = ("ident", "tag", "known", "ring", "emit_call", "emit_line", "localtrace")

    def __init__(self, ident: int, tag: str | None) -> None:
        self.ident = ident
        # On 3.12+ a new thread's first events come before threading registers it: name it later.
        self.tag = tag if tag is not None else f"{{thread-{ident}}} "
        self.known = tag is not None
        self.ring: deque[tuple[float | None, str]] | None = None
        self.emit_call: Callable[[str], None] | None = None
        self.emit_line: Callable[[str], None] | None = None
        self.localtrace: Callable[..., Any] | None = None

    def refresh(self) -> None:
        """Take the thread's name once threading has registered it."""
        tag = thread_tag(self.ident)
        if tag is not None:
            self.tag, self.known = tag, True


MUTED = ThreadState(0, "")  # the tracer's own watchdog thread: nothing recorded, no local tracer


class ThreadTable:
    """Thread ident -> :class:`ThreadState`, created on a thread's first traced event.

    ``attach`` fills a new state's recording functions (the sink's emitters, the local tracer).
    """

    def __init__(self, attach: Callable[[ThreadState], None]) -> None:
        self.states: dict[int, ThreadState] = {}
        self.main_ident = threading.main_thread().ident
        self._attach = attach

    def tag(self, ident: int) -> str | None:
        """"" for the main thread, "{name} " for others, None while the thread is not registered."""
        if ident == self.main_ident:
            return ""
        return thread_tag(ident)

    def new(self, ident: int) -> ThreadState:
        """The state for a thread seen for the first time (the backends' slow path)."""
        tag = self.tag(ident)
        if tag == WATCHDOG_TAG:
            self.states[ident] = MUTED
            return MUTED
        st = ThreadState(ident, tag)
        self._attach(st)
        self.states[ident] = st
        return st

    def recording(self) -> list[ThreadState]:
        """States that keep a ring (a snapshot: other threads may add states meanwhile)."""
        return [st for st in list(self.states.values()) if st.ring is not None]

    def after_fork_child(self) -> None:
        """In a forked child only the forking thread is left: it becomes the main thread, with an
        empty ring. Its local tracer and emitters stay installed and keep working."""
        self.main_ident = threading.get_ident()
        for ident in [i for i in self.states if i != self.main_ident]:
            self.states.pop(ident, None)
        st = self.states.get(self.main_ident)
        if st is not None and st is not MUTED:
            st.tag, st.known = "", True
            if st.ring is not None:
                st.ring.clear()
