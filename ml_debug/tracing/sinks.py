"""Where NicerTrace's events go: streamed to a file (or stdout) as they happen, or kept in a ring.

Dumps run inside the traced program (a signal handler, the watchdog thread, exit): everything
here avoids calling standard-library Python code that the tracer would then record (no
``os.path``, no enum), and this directory itself is never traced.

Standard library only: :mod:`ml_debug.nicertrace` imports it into user programs.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from ml_debug.tracing.formats import LineFormat, Prefix, Write
from ml_debug.tracing.identity import format_elapsed
from ml_debug.tracing.threads import ThreadState

BATCH = 512  # lines collected before a write in the parent (a forked child writes each line)


def _discard(s: str) -> None:
    """The writer while no file is open for this process."""


class StreamSink:
    """Every event written as it happens: to the per-process file, or to stdout as ``trace.Trace``
    does.

    File lines collect in one list that every traced thread appends to, and reach the file through
    :meth:`flush_file` (a full batch, the watchdog's flush, a fork, the end): one writer at a time
    under a lock, with ``os.write`` on an ``O_APPEND`` descriptor, so lines stay whole, in order
    and each with its own thread's tag. A forked child drops the parent's unwritten lines (the
    parent writes them) and writes each of its own lines at once, with one ``os.write``:
    multiprocessing's workers end with ``os._exit``, which flushes nothing.
    """

    def __init__(self, fmt: LineFormat, clock: Callable[[], float], t0: float, timing: bool,
                 echo: bool) -> None:
        self.fmt = fmt
        self.out: Write = [sys.stdout.write]
        self.pfx: Prefix = [""]
        self.fd: int | None = None
        self._clock, self._t0, self._timing, self._echo = clock, t0, timing, echo
        self._pending: list[str] = []
        self._lock = threading.RLock()  # re-entered by a signal dump that interrupts a flush
        self._flushing = False
        self._direct = False  # each line written at once (a forked child)
        self._paused = False
        self._writer: Callable[[str], Any] = _discard
        self._pid = 0  # the process that opened the file

    @property
    def buffered(self) -> bool:
        """Lines wait in memory: the watchdog must flush them (not in a forked child)."""
        return self.fd is not None and not self._direct

    def attach(self, st: ThreadState) -> None:
        st.emit_call, st.emit_line = self.fmt.stream_emitters(self.out, self.pfx, self._clock, self._t0,
                                                              self._timing, st)

    def to_stdout(self) -> None:
        self._install(lambda s: sys.stdout.write(s))  # the current stdout, as trace.Trace prints

    def _install(self, writer: Callable[[str], Any]) -> None:
        self._writer = writer
        if not self._paused:
            self.out[0] = writer

    def open(self, path: str, header: str) -> None:
        # never through a link planted at the trace file's name (the directory may be shared)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     0o666)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1 or st.st_uid not in (os.geteuid(), os.getuid()):
            # a FIFO, another user's file, or a hard link planted at the name (to a file of root's)
            os.close(fd)
            raise PermissionError(errno.EPERM, "not a regular file of ours with one name: not written", path)
        os.set_blocking(fd, True)
        self.fd = fd
        self._pid = os.getpid()
        pending = self._pending = [header]
        self.flush_file()
        write: Callable[[str], None]
        if self._direct:
            def write(s: str) -> None:
                try:
                    os.write(fd, s.encode("utf-8", "replace"))  # one line, whole (O_APPEND)
                except OSError:
                    pass
        else:
            append, flush = pending.append, self.flush_file

            def write(s: str) -> None:
                append(s)
                if len(pending) >= BATCH:
                    flush()

        if self._echo:
            def tee(s: str) -> None:
                write(s)
                sys.stdout.write(s)

            self._install(tee)
        else:
            self._install(write)

    def flush(self) -> None:
        if self.fd is not None:
            self.flush_file()
            return
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass

    def flush_file(self) -> None:
        """Write the collected lines (from any thread; a re-entered call leaves it to the outer one).

        Not in a forked child before its own file is open: fork hooks that run before the tracer's
        may already record, and those lines must not reach the parent's file.
        """
        fd = self.fd
        if fd is None or self._pid != os.getpid():
            return
        with self._lock:
            if self._flushing:
                return
            self._flushing = True
            try:
                pending = self._pending
                n = len(pending)  # threads may append meanwhile: take these n, in order
                data = "".join(pending[:n]).encode("utf-8", "replace")
                del pending[:n]
                while data:
                    data = data[os.write(fd, data):]
            except OSError:
                pass
            finally:
                self._flushing = False

    def close(self) -> None:
        if self.fd is not None:
            self.flush_file()
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None
            self._install(_discard)  # threads still running after the end write nothing

    def forget_file(self) -> None:
        """In a forked child: the descriptor and the unwritten lines are the parent's (it writes
        them). Nothing is recorded until :meth:`resume` (the tracer's own set-up is not the
        program's), and then every line is written at once."""
        self._install(_discard)
        self._paused = True
        self._lock = threading.RLock()  # a parent thread may have held it at the fork
        self._flushing = False
        self._pending = []
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None
        self._direct = True

    def resume(self) -> None:
        """Record again, after a fork's set-up."""
        self._paused = False
        self.out[0] = self._writer


class RingSink:
    """The last ``size`` events of every thread, in memory; :meth:`dump` writes them all at once
    (main thread last), replacing the file atomically."""

    def __init__(self, size: int, fmt: LineFormat, clock: Callable[[], float], t0: float,
                 timing: bool) -> None:
        self.size = size
        self.fmt = fmt
        self.pfx: Prefix = [""]
        self.fd = None  # never a stream file
        self.buffered = False
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
        """In a forked child: number the child's own dumps from 1 (and a parent thread may have
        held the lock at the fork)."""
        self._dumps = 0
        self._lock = threading.RLock()

    def resume(self) -> None:
        """Nothing to resume: the fork's set-up is recorded, then the ring is emptied."""

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
