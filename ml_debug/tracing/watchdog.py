"""When NicerTrace writes without being asked: dump signals, and the watchdog thread that flushes
the stream, notices quiet (idle dump) and handles signals the blocked main thread cannot.

Standard library only: :mod:`ml_debug.nicertrace` imports it into user programs.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ml_debug.tracing.threads import WATCHDOG_NAME

# Signals whose default action is not worth dying for: dump a snapshot and keep running.
SNAPSHOT_SIGNALS = {getattr(signal, n) for n in ("SIGUSR1", "SIGUSR2") if hasattr(signal, n)}
SIGNAMES = {s.value: s.name for s in signal.Signals}  # the dump path must not call enum code

Dump = Callable[[str], object]


class SignalDumps:
    """Python handlers for the dump signals: write a dump, then do what the signal did before
    (call the old handler, keep running for USR1/USR2, or die of the signal)."""

    def __init__(self, signals: Iterable[signal.Signals], dump: Dump) -> None:
        self.signals = tuple(signals)
        self._dump = dump
        self.old: dict[int, Any] = {}
        self.handled: dict[int, int] = {}  # signal -> times a Python handler ran (the watchdog waits on it)

    @property
    def installed(self) -> bool:
        return bool(self.old)

    def install(self) -> None:
        if not self.signals or threading.current_thread() is not threading.main_thread():
            return
        for sig in self.signals:
            try:
                self.old[sig] = signal.signal(sig, self._on_signal)
            except (OSError, ValueError):
                pass

    def restore(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, old in self.old.items():
            try:
                if signal.getsignal(sig) == self._on_signal:
                    signal.signal(sig, old)
            except (OSError, ValueError, TypeError):
                pass
        self.old.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._dump(f"signal {SIGNAMES.get(signum, str(signum))}")
        self.handled[signum] = self.handled.get(signum, 0) + 1
        old = self.old.get(signum, signal.SIG_DFL)
        if callable(old):
            old(signum, frame)
        elif old == signal.SIG_DFL and signum not in SNAPSHOT_SIGNALS:
            # Die the way the signal would have killed us, now that the tail is on disk.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def from_watchdog(self, signum: int, flush: Callable[[], object]) -> None:
        """A dump signal woke the watchdog: if the main thread does not handle it soon (blocked in
        C, e.g. a collective), dump from here, and for a deadly signal end the process."""
        handled = self.handled.get(signum, 0)
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:  # the main thread handles it if it runs Python code
            if self.handled.get(signum, 0) != handled:
                return
            time.sleep(0.02)
        self._dump(f"signal {SIGNAMES.get(signum, str(signum))} (main thread blocked)")
        old = self.old.get(signum, signal.SIG_DFL)
        if old == signal.SIG_DFL and signum not in SNAPSHOT_SIGNALS:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                if self.handled.get(signum, 0) != handled:
                    return
                time.sleep(0.05)
            # Blocked in C for good: the tail is on disk, so end as the signal would have.
            flush()
            os._exit(128 + signum)


class Watchdog:
    """One daemon thread: flushes the stream, notices quiet (idle dump) and receives dump signals
    through the signal wakeup fd, so they are handled while the main thread is blocked in C."""

    def __init__(self, *, dump: Dump, flush: Callable[[], object], signals: SignalDumps,
                 ring: bool, idle_dump: float | None, flush_interval: float,
                 last_events: Callable[[], list[Any]], clock: Callable[[], float]) -> None:
        self._dump, self._flush, self._signals = dump, flush, signals
        self._ring, self._idle_dump, self._flush_interval = ring, idle_dump, flush_interval
        self._last_events, self._clock = last_events, clock
        self._thread: threading.Thread | None = None
        self._pipe: tuple[int, int] | None = None
        self._wakeup = -1
        self._ready = threading.Event()

    def wanted(self, buffered_stream: bool) -> bool:
        """Needed for ring dumps, or to flush a stream whose lines wait in memory."""
        return bool(self._ring and (self._idle_dump or self._signals.signals)) or bool(
            buffered_stream and self._flush_interval)

    def start(self) -> None:
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._pipe = (r, w)
        self._wakeup = -1
        if self._signals.installed and threading.current_thread() is threading.main_thread():
            try:
                old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
                if old != -1:  # someone (asyncio) owns it: give it back, Python handlers still work
                    signal.set_wakeup_fd(old)
                else:
                    self._wakeup = w
            except (ValueError, OSError):
                pass
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=WATCHDOG_NAME, daemon=True)
        self._thread.start()
        self._ready.wait(5)  # its start-up code runs before tracing starts, so it is not recorded

    def stop(self) -> None:
        if self._pipe is None:
            return
        r, w = self._pipe
        if self._wakeup == w and threading.current_thread() is threading.main_thread():
            try:
                signal.set_wakeup_fd(-1)
            except (ValueError, OSError):
                pass
        try:
            os.write(w, b"\0")  # 0 is no signal: it means stop
        except OSError:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        for fd in (r, w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._pipe = None

    def forget(self) -> None:
        """In a forked child: the parent's thread does not exist here, and its pipe is the parent's.

        The signal wakeup fd must not stay on that pipe: a signal to the child (a pool or a
        DataLoader terminating its worker) would wake the parent's watchdog, which would then take
        it for its own, dump, and end the parent.
        """
        if self._wakeup != -1:
            try:
                old = signal.set_wakeup_fd(-1)
                if old not in (-1, self._wakeup):  # not ours any more: leave the owner's in place
                    signal.set_wakeup_fd(old)
            except (ValueError, OSError):
                pass
        if self._pipe is not None:
            for fd in self._pipe:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._pipe = None
        self._thread = None
        self._wakeup = -1

    def _watch(self) -> None:
        sys.settrace(None)
        signals = self._signals.signals
        if signals and hasattr(signal, "pthread_sigmask"):
            # Let the kernel deliver them to a thread that runs Python handlers, not to us.
            signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        self._ready.set()
        assert self._pipe is not None
        r = self._pipe[0]
        intervals = [self._flush_interval or 1.0]
        if self._idle_dump:
            intervals.append(max(0.05, self._idle_dump / 4))
        interval = min(intervals)
        last_seen: list[Any] = []
        last_change = self._clock()
        idle_dumped = False
        while True:
            try:
                ready = select.select([r], [], [], interval)[0]
                data = os.read(r, 64) if ready else b""
            except OSError:
                return
            for signum in data:
                if signum == 0:
                    return
                if signum in signals:
                    self._signals.from_watchdog(signum, self._flush)
            if not self._ring:
                self._dump("flush")
                continue
            if self._idle_dump:
                seen = self._last_events()
                if len(seen) != len(last_seen) or any(a is not b for a, b in zip(seen, last_seen, strict=True)):
                    last_seen, last_change, idle_dumped = seen, self._clock(), False
                elif not idle_dumped and any(seen) and self._clock() - last_change >= self._idle_dump:
                    self._dump(f"idle {self._idle_dump:g}s")
                    idle_dumped = True
