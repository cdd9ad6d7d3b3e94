"""How NicerTrace writes an event: the ``nicer`` line format and the seed's, and their text caches.

Two kinds of event: a call (``head``, once per code object) and an executed line (``body``,
once per file and line). Their text is rendered on first sight and cached; writing an event
then adds only the per-event parts (time stamp, pid, thread tag).

Standard library only: :mod:`ml_debug.nicertrace` imports it into user programs.
"""

from __future__ import annotations

import linecache
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ml_debug.tracing.identity import format_elapsed, format_elapsed_seconds

if TYPE_CHECKING:
    from ml_debug.tracing.filter import TraceFilter
    from ml_debug.tracing.threads import ThreadState

Emit = Callable[[str], None]
Write = list[Callable[[str], Any]]  # a one-item list: the sink swaps the writer, emitters keep it
Prefix = list[str]  # a one-item list: the pid marker, renewed in a forked child


class LineFormat:
    """One way of writing events; see :class:`NicerFormat` and :class:`SeedFormat`."""

    name: str
    stamp_calls: bool  # ring mode: does a call keep its time stamp
    header_extra: str  # appended to the file's ``# nicertrace`` header

    @staticmethod
    def head(code: Any, where: str) -> str:
        """A call's text (without stamp, pid and thread tag)."""
        raise NotImplementedError

    @staticmethod
    def body(filename: str, lineno: int) -> str:
        """An executed line's text (without stamp, pid and thread tag)."""
        raise NotImplementedError

    @staticmethod
    def pid_prefix(pid: int) -> str:
        raise NotImplementedError

    @staticmethod
    def render(elapsed: float | None, pfx: str, tag: str, body: str) -> str:
        """One line of a ring dump (``elapsed`` None: no stamp)."""
        raise NotImplementedError

    @staticmethod
    def stream_emitters(out: Write, pfx: Prefix, clock: Callable[[], float], t0: float, timing: bool,
                        st: ThreadState) -> tuple[Emit, Emit]:
        """(emit call, emit line) that write each event at once, for one thread."""
        raise NotImplementedError


class NicerFormat(LineFormat):
    """``0:00:01.234 [pid N] {thread} --> pkg.module:12 Class.method`` and
    ``0:00:01.235     module.py:13: source`` (stamp, pid and thread tag where they apply)."""

    name = "nicer"
    stamp_calls = True  # ring mode: calls keep their time too
    header_extra = ""

    @staticmethod
    def head(code: Any, where: str) -> str:
        return f"--> {where}:{code.co_firstlineno} {getattr(code, 'co_qualname', code.co_name)}"

    @staticmethod
    def body(filename: str, lineno: int) -> str:
        source = linecache.getline(filename, lineno).strip()
        return f"    {os.path.basename(filename)}:{lineno}: {source}"

    @staticmethod
    def pid_prefix(pid: int) -> str:
        return f"[pid {pid}] "

    @staticmethod
    def render(elapsed: float | None, pfx: str, tag: str, body: str) -> str:
        stamp = f"{format_elapsed(elapsed)} " if elapsed is not None else ""
        return f"{stamp}{pfx}{tag}{body}\n"

    @staticmethod
    def stream_emitters(out: Write, pfx: Prefix, clock: Callable[[], float], t0: float, timing: bool,
                        st: ThreadState) -> tuple[Emit, Emit]:
        if timing:
            def emit(body: str) -> None:
                if not st.known:
                    st.refresh()
                out[0](f"{format_elapsed(clock() - t0)} {pfx[0]}{st.tag}{body}\n")
        else:
            def emit(body: str) -> None:
                if not st.known:
                    st.refresh()
                out[0](f"{pfx[0]}{st.tag}{body}\n")
        return emit, emit


class SeedFormat(LineFormat):
    """The format of the seed's NicerTrace (stas00's ML engineering handbook), for tools that parse it.

    A call: ``[PID ] where:first name`` (a leading space, no stamp, the function's unqualified
    name). A line: ``[PID ][H:MM:SS ]file.py:  NNNN: source`` (the number right-aligned in six,
    the source line as written, indentation kept). No thread tags.
    """

    name = "seed"
    stamp_calls = False
    header_extra = " format=seed"

    @staticmethod
    def head(code: Any, where: str) -> str:
        return f" {where}:{code.co_firstlineno} {code.co_name}"

    @staticmethod
    def body(filename: str, lineno: int) -> str:
        source = linecache.getline(filename, lineno).rstrip("\r\n")
        return f"{os.path.basename(filename)}:{lineno:>6}: {source}"

    @staticmethod
    def pid_prefix(pid: int) -> str:
        return f"{pid} "

    @staticmethod
    def render(elapsed: float | None, pfx: str, tag: str, body: str) -> str:
        stamp = f"{format_elapsed_seconds(elapsed)} " if elapsed is not None else ""
        return f"{pfx}{stamp}{body}\n"

    @staticmethod
    def stream_emitters(out: Write, pfx: Prefix, clock: Callable[[], float], t0: float, timing: bool,
                        st: ThreadState) -> tuple[Emit, Emit]:
        def emit_call(body: str) -> None:
            out[0](f"{pfx[0]}{body}\n")

        if timing:
            def emit_line(body: str) -> None:
                out[0](f"{pfx[0]}{format_elapsed_seconds(clock() - t0)} {body}\n")
        else:
            emit_line = emit_call
        return emit_call, emit_line


FORMATS: dict[str, LineFormat] = {"nicer": NicerFormat(), "seed": SeedFormat()}


class EventText:
    """Call-line text per code object (None: not traced) and line text per (file, line), cached.

    The backends read ``heads`` and ``bodies`` directly on their hot paths and call
    :meth:`head` / :meth:`body` only on a miss.
    """

    def __init__(self, flt: TraceFilter, fmt: LineFormat) -> None:
        self.heads: dict[Any, str | None] = {}
        self.bodies: dict[tuple[str, int], str] = {}
        self._where = flt.where
        self._head = fmt.head
        self._body = fmt.body

    def head(self, code: Any, globals_: dict[str, Any] | None) -> str | None:
        where = self._where(code, globals_)
        head = self.heads[code] = None if where is None else self._head(code, where)
        return head

    def body(self, key: tuple[str, int]) -> str:
        body = self.bodies[key] = self._body(*key)
        return body
