"""Where NicerTrace's events go: streamed to a file (or stdout) as they happen, or kept in a ring.

Dumps run inside the traced program (a signal handler, the watchdog thread, exit): everything
here avoids calling standard-library Python code that the tracer would then record (no
``os.path``, no enum), and this directory itself is never traced.

Standard library only: :mod:`ml_debug.nicertrace` imports it into user programs.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from ml_debug.tracing.formats import LineFormat, Prefix, Write
from ml_debug.tracing.identity import format_elapsed
from ml_debug.tracing.threads import ThreadState


class StreamSink:
    """Every event written as it happens: to the per-process file (the watchdog flushes it), or to
    stdout as ``trace.Trace`` does."""

    def __init__(self, fmt: LineFormat, clock: Callable[[], float], t0: float, timing: bool,
                 echo: bool) -> None:
        self.fmt = fmt
        self.out: Write = [sys.stdout.write]
        self.pfx: Prefix = [""]
        self.file: Any = None
        self._clock, self._t0, self._timing, self._echo = clock, t0, timing, echo

    def attach(self, st: ThreadState) -> None:
        st.emit_call, st.emit_line = self.fmt.stream_emitters(self.out, self.pfx, self._clock, self._t0,
                                                              self._timing, st)

    def to_stdout(self) -> None:
        self.out[0] = lambda s: sys.stdout.write(s)  # the current stdout, as trace.Trace prints

    def open(self, path: str, header: str) -> None:
        # never through a link planted at the trace file's name (the directory may be shared)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        f = open(fd, "a", encoding="utf-8", errors="replace")  # noqa: SIM115
        f.write(header)
        f.flush()
        self.file = f
        if self._echo:
            def tee(s: str, _w: Callable[[str], Any] = f.write) -> None:
                _w(s)
                sys.stdout.write(s)

            self.out[0] = tee
        else:
            self.out[0] = f.write

    def flush(self) -> None:
        try:
            if self.file is not None:
                self.file.flush()
            else:
                sys.stdout.flush()
        except (OSError, ValueError):
            pass

    def flush_file(self) -> None:
        if self.file is not None:
            try:
                self.file.flush()
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except OSError:
                pass
            self.file = None
            self.out[0] = sys.stdout.write

    def forget_file(self) -> None:
        """In a forked child: the parent's file object is the parent's (flushed before the fork)."""
        self.file = None


class RingSink:
    """The last ``size`` events of every thread, in memory; :meth:`dump` writes them all at once
    (main thread last), replacing the file atomically."""

    def __init__(self, size: int, fmt: LineFormat, clock: Callable[[], float], t0: float,
                 timing: bool) -> None:
        self.size = size
        self.fmt = fmt
        self.pfx: Prefix = [""]
        self.file = None  # never a stream file
        self._clock, self._t0, self._timing = clock, t0, timing
        self._lock = threading.RLock()
        self._dumps = 0

    def attach(self, st: ThreadState) -> None:
        ring: deque[tuple[float | None, str]] = deque(maxlen=self.size)
        st.ring = ring
        append, clock = ring.append, self._clock

        def emit_line(body: str) -> None:
            if not st.known:
                st.refresh()
            append((clock(), body))

        if self.fmt.stamp_calls:
            st.emit_call, st.emit_line = emit_line, emit_line
        else:
            def emit_call(body: str) -> None:
                if not st.known:
                    st.refresh()
                append((None, body))

            st.emit_call, st.emit_line = emit_call, emit_line

    def flush_file(self) -> None:
        """Nothing is streamed in ring mode."""

    def forget_file(self) -> None:
        """In a forked child: number the child's own dumps from 1."""
        self._dumps = 0

    def dump(self, path: str, header: str, reason: str, states: list[ThreadState],
             main_ident: int | None) -> str | None:
        """Write every thread's ring to ``path``; returns it, or None when writing failed."""
        with self._lock:
            self._dumps += 1
            now = self._clock()
            states.sort(key=lambda st: st.ident == main_ident)
            t0, render, pfx = self._t0, self.fmt.render, self.pfx[0]
            lines = [header, f"# dump reason={reason} at={format_elapsed(now - t0)} threads={len(states)}\n"]
            for st in states:
                events = list(st.ring or ())
                lines.append(f"# thread {st.tag.strip() or '{main}'} ident={st.ident} last {len(events)} events\n")
                for t, body in events:
                    lines.append(render(t - t0 if (t is not None and self._timing) else None, pfx, st.tag, body))
            tmp = f"{path}.{os.getpid()}.{os.urandom(6).hex()}.tmp"  # a new file: nothing planted is written
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
                with open(fd, "w", encoding="utf-8", errors="replace") as f:
                    f.write("".join(lines))
                os.replace(tmp, path)
            except OSError:
                return None
        return path
