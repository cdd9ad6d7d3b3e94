"""How NicerTrace sees calls and lines: ``sys.settrace``, or ``sys.monitoring`` on Python 3.12+.

Both backends share the same caches (:class:`~ml_debug.tracing.formats.EventText`), thread table
and counts, so their output and ``results().counts`` are the same as ``trace.Trace``'s.

Cost of code that is not traced: one dictionary lookup per call under ``sys.settrace`` (the
global trace function returns None, so no per-line tracer is installed); nothing at all under
``sys.monitoring``, which disables its start event per code object.

Standard library only: :mod:`ml_debug.nicertrace` imports it into user programs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ml_debug.tracing.formats import EventText
from ml_debug.tracing.threads import MUTED, ThreadState, ThreadTable

MISSING: Any = object()
TOOL_NAME = "mldebug-nicertrace"


def make_localtrace(st: ThreadState, text: EventText, counts: dict[Any, int],
                    counting: bool) -> Callable[..., Any]:
    """A thread's ``sys.settrace`` local tracer: counts and records every executed line."""
    emit = st.emit_line
    bodies, make_body = text.bodies, text.body

    def localtrace(frame: Any, why: str, arg: Any) -> Any:
        if why == "line":
            key = (frame.f_code.co_filename, frame.f_lineno)
            if counting:
                counts[key] = counts.get(key, 0) + 1
            if emit is not None:
                emit(bodies.get(key) or make_body(key))
        return localtrace

    return localtrace


class SettraceBackend:
    """``sys.settrace``: :attr:`globaltrace` sees every new frame and returns the thread's local
    tracer for traced code only. ``trace.Trace``'s run methods (or ``NicerTrace.start``) install
    it, for the calling thread and, through ``threading.settrace``, for threads started later."""

    name = "settrace"

    def __init__(self, text: EventText, threads: ThreadTable) -> None:
        heads_get, decide = text.heads.get, text.head
        local, new_state = threads.local, threads.new

        def globaltrace(frame: Any, why: str, arg: Any) -> Any:
            # Called for every new frame: the excluded path is one dict lookup and `return None`,
            # so excluded code never gets a per-line tracer.
            code = frame.f_code
            head = heads_get(code, MISSING)
            if head is MISSING:
                head = decide(code, frame.f_globals)
            if head is None:
                return None
            try:
                st = local.st
            except AttributeError:  # the thread's first traced call
                st = new_state()
            emit = st.emit_call
            if emit is not None:
                emit(head)
            return st.localtrace  # None for the tracer's own watchdog

        self.globaltrace = globaltrace


def free_tool_id() -> int | None:
    """A ``sys.monitoring`` tool id nobody holds (debuggers and profilers take some)."""
    mon = sys.monitoring  # type: ignore[attr-defined]
    return next((t for t in (4, 3, 5, 2, 1, 0) if mon.get_tool(t) is None), None)


class MonitoringBackend:
    """``sys.monitoring`` (3.12+): PY_START/PY_RESUME globally, LINE and JUMP only in traced code;
    code that is not traced is disabled for good after its first start event."""

    name = "monitoring"

    def __init__(self, text: EventText, threads: ThreadTable, counts: dict[Any, int],
                 counting: bool) -> None:
        self._text, self._threads, self._counts, self._counting = text, threads, counts, counting
        # The hot paths read these directly (one attribute lookup, not two).
        self._heads, self._bodies, self._local = text.heads, text.bodies, threads.local
        self._tool: int | None = None
        self._codes: list[Any] = []
        self._jump_lines: dict[tuple[Any, int], int] = {}

    def start(self) -> None:
        mon = sys.monitoring  # type: ignore[attr-defined]
        tool = free_tool_id()
        if tool is None:  # activation checked; another tool took the last id since
            raise RuntimeError("every sys.monitoring tool id is taken; use backend='settrace'")
        mon.use_tool_id(tool, TOOL_NAME)
        self._tool = tool
        ev = mon.events
        mon.register_callback(tool, ev.PY_START, self._call)
        mon.register_callback(tool, ev.PY_RESUME, self._call)
        mon.register_callback(tool, ev.LINE, self._line)
        mon.register_callback(tool, ev.JUMP, self._jump)
        mon.restart_events()  # code disabled by an earlier tracer must be seen again
        mon.set_events(tool, ev.PY_START | ev.PY_RESUME)

    def stop(self) -> None:
        tool = self._tool
        if tool is None:
            return
        mon = sys.monitoring  # type: ignore[attr-defined]
        mon.set_events(tool, 0)
        for code in self._codes:
            try:
                mon.set_local_events(tool, code, 0)
            except ValueError:
                pass
        self._codes.clear()
        for event in (mon.events.PY_START, mon.events.PY_RESUME, mon.events.LINE, mon.events.JUMP):
            mon.register_callback(tool, event, None)
        mon.free_tool_id(tool)
        self._tool = None

    def _call(self, code: Any, offset: int) -> Any:
        head = self._heads.get(code, MISSING)
        if head is MISSING:
            frame = sys._getframe(1)
            head = self._text.head(code, frame.f_globals if frame.f_code is code else None)
            if head is not None:
                assert self._tool is not None  # callbacks are registered only while a tool id is held
                ev = sys.monitoring.events  # type: ignore[attr-defined]
                sys.monitoring.set_local_events(self._tool, code, ev.LINE | ev.JUMP)  # type: ignore[attr-defined]
                self._codes.append(code)
        if head is None:
            return sys.monitoring.DISABLE  # type: ignore[attr-defined]  # never again for this code
        try:
            st = self._local.st
        except AttributeError:  # the thread's first traced call
            st = self._threads.new()
        if st.emit_call is not None:
            st.emit_call(head)
        return None

    def _line(self, code: Any, line: int) -> Any:
        try:
            st = self._local.st
        except AttributeError:
            st = self._threads.new()
        if st is MUTED:
            return None
        key = (code.co_filename, line)
        if self._counting:
            self._counts[key] = self._counts.get(key, 0) + 1
        if st.emit_line is not None:
            st.emit_line(self._bodies.get(key) or self._text.body(key))
        return None

    def _jump(self, code: Any, offset: int, destination: int) -> Any:
        # sys.settrace reports a line again when a loop jumps back to the same line (a one-line
        # loop, an inlined comprehension); LINE does not. Replay that so counts match settrace.
        # Each jump instruction goes one way to one place: all others are disabled for good.
        key = (code, offset)
        line = self._jump_lines.get(key)
        if line is None:
            if destination >= offset:
                return sys.monitoring.DISABLE  # type: ignore[attr-defined]
            lines = {}
            for start, end, lineno in code.co_lines():
                for o in (offset, destination):
                    if start <= o < end:
                        lines[o] = lineno
            line = lines.get(destination)
            if line is None or line != lines.get(offset):
                return sys.monitoring.DISABLE  # type: ignore[attr-defined]
            self._jump_lines[key] = line
        return self._line(code, line)
