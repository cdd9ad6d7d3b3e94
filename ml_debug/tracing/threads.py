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


KEEP_FINISHED = 32  # finished threads whose rings are still dumped; older ones are dropped


def registered(ident: int) -> threading.Thread | None:
    """The thread threading knows under ``ident``, None while it does not (yet).

    Reads threading's registry without calling into it (the dump path must stay untraced).
    """
    return threading._active.get(ident)  # type: ignore[attr-defined]


def thread_tag(thread: threading.Thread) -> str:
    """``"{name} "`` for a thread other than the main one."""
    return "{" + str(thread._name).replace("}", ")") + "} "  # type: ignore[attr-defined]


class ThreadState:
    """One traced thread. The backends call ``emit_call`` / ``emit_line`` (None: write nothing,
    counting only) and install ``localtrace`` (sys.settrace) for its frames."""

    __slots__ = ("ident", "tag", "known", "thread", "ring", "emit_call", "emit_line", "localtrace")

    def __init__(self, ident: int, tag: str | None, thread: threading.Thread | None = None) -> None:
        self.ident = ident
        # On 3.12+ a new thread's first events come before threading registers it: name it later.
        self.tag = tag if tag is not None else f"{{thread-{ident}}} "
        self.known = tag is not None
        self.thread = thread  # threading's object, once registered: tells a finished thread
        self.ring: deque[tuple[float | None, str]] | None = None
        self.emit_call: Callable[[str], None] | None = None
        self.emit_line: Callable[[str], None] | None = None
        self.localtrace: Callable[..., Any] | None = None

    def refresh(self) -> None:
        """Take the thread's name once threading has registered it."""
        thread = registered(self.ident)
        if thread is not None:
            self.tag, self.known, self.thread = thread_tag(thread), True, thread

    def finished(self) -> bool:
        """The thread has ended (its ident may already belong to a new thread)."""
        return self.thread is not None and registered(self.ident) is not self.thread


MUTED = ThreadState(0, "")  # the tracer's own watchdog thread: nothing recorded, no local tracer


class ThreadTable:
    """Each thread's :class:`ThreadState`, created on the thread's first traced event.

    The backends find the current thread's state in :attr:`local` (a ``threading.local``): it ends
    with its thread, so a new thread that reuses a finished thread's ident starts with its own tag
    and ring. :attr:`states` lists them all for dumps, finished threads included (what a worker did
    last), up to :data:`KEEP_FINISHED` finished ones. ``attach`` fills a new state's recording
    functions (the sink's emitters, the local tracer).
    """

    def __init__(self, attach: Callable[[ThreadState], None]) -> None:
        self.local = threading.local()
        self.states: list[ThreadState] = []
        self.main_ident = threading.main_thread().ident
        self._attach = attach
        self._lock = threading.Lock()

    def new(self) -> ThreadState:
        """The current thread's state, seen for the first time (the backends' slow path)."""
        ident = threading.get_ident()
        thread = registered(ident)
        if ident == self.main_ident:
            tag: str | None = ""
        else:
            tag = None if thread is None else thread_tag(thread)
        if tag == WATCHDOG_TAG:
            self.local.st = MUTED
            return MUTED
        st = ThreadState(ident, tag, thread)
        self._attach(st)
        self.local.st = st
        with self._lock:
            finished = [s for s in self.states if s.finished()]
            drop = finished[:-KEEP_FINISHED] if len(finished) > KEEP_FINISHED else []
            self.states = [s for s in self.states if s not in drop] + [st]
        return st

    def recording(self) -> list[ThreadState]:
        """States that keep a ring (a snapshot: other threads may add states meanwhile)."""
        return [st for st in self.states if st.ring is not None]

    def after_fork_child(self) -> None:
        """In a forked child only the forking thread is left: it becomes the main thread, with an
        empty ring. Its local tracer and emitters stay installed and keep working."""
        self._lock = threading.Lock()  # another thread of the parent may have held it
        self.main_ident = threading.get_ident()
        st = getattr(self.local, "st", None)
        self.states = [st] if st is not None and st is not MUTED else []
        if st is not None and st is not MUTED:
            st.tag, st.known = "", True
            if st.ring is not None:
                st.ring.clear()
