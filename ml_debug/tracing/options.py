"""NicerTrace's settings in one validated dataclass.

Standard library only: :mod:`ml_debug.nicertrace` imports it into user programs.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

BACKENDS = ("auto", "settrace", "monitoring")
LINE_FORMATS = ("nicer", "seed")
MAX_RING = 10_000_000  # events per thread: about 1 GB of memory per traced thread at the most
# No handler can be installed for these: as a dump signal, one would silently dump nothing.
UNCATCHABLE = frozenset(getattr(signal, n) for n in ("SIGKILL", "SIGSTOP") if hasattr(signal, n))


def needs_ring(ring: int | None, idle_dump: float | None) -> bool:
    """The one rule of idle dumps (``mldebug trace --idle-dump`` and ``NicerTrace(idle_dump=...)``): an
    idle dump writes the ring, so it needs one."""
    return idle_dump is not None and ring is None


def _normalise_packages(packages: Any) -> tuple[str, ...] | None:
    if packages is None:
        return None
    if isinstance(packages, str):
        # A bare string is one name (or "a,b"), never a sequence of characters.
        packages = [] if packages == "uninstalled" else packages.split(",")
    names = []
    for name in packages:
        if not isinstance(name, str):
            raise TypeError(f"packages_to_include: expected package names, got {name!r}")
        name = name.strip()
        if name == "uninstalled":
            continue
        top = name.split(".")[0]
        if not top.isidentifier():
            raise ValueError(f"packages_to_include: {name!r} is not a top-level package name")
        names.append(top)
    return tuple(names)


def _as_tuple(value: Any) -> tuple[str, ...]:
    if not value:
        return ()
    if isinstance(value, (str, os.PathLike)):
        return (os.fspath(value),)  # one directory or module, not its characters
    return tuple(os.fspath(v) for v in value)


@dataclass(frozen=True)
class TraceOptions:
    """What to trace, how to write it and when to dump it.

    ``NicerTrace(**fields)`` and ``NicerTrace.from_options(TraceOptions(...))`` are the same
    tracer. The first nine fields are :class:`trace.Trace`'s parameters, in its order. Values are
    normalised on construction (a single string for ``ignoredirs`` is one directory, a package
    string ``"a,b"`` is two names) and contradictions raise ``ValueError``.
    """

    count: int = 1
    """Count executed lines (``results().counts``), as ``trace.Trace``."""
    trace: int = 1
    """Write a line per call and per executed line."""
    countfuncs: int = 0
    """``trace.Trace``'s list of called functions; overrides ``count`` and ``trace``."""
    countcallers: int = 0
    """``trace.Trace``'s caller/callee pairs; overrides ``count`` and ``trace``."""
    ignoremods: tuple[str, ...] = ()
    """Modules never traced: a dotted name also excludes its submodules."""
    ignoredirs: tuple[str, ...] = ()
    """Directories whose code is never traced (with everything below them)."""
    infile: str | None = None
    """``trace.Trace``: counts to merge into ``results()``."""
    outfile: str | None = None
    """``trace.Trace``: where ``results().write_results`` stores counts."""
    timing: bool = True
    """An elapsed-time stamp on every line."""
    packages_to_include: tuple[str, ...] | None = None
    """``None``: everything; ``()`` / ``"uninstalled"``: only code outside site-packages and the
    standard library; names: that code plus these top-level packages."""
    log_pids: bool = False
    """Mark every line with the process id."""
    out_dir: str | None = None
    """Directory for ``trace-{host}-{rank}-{pid}.txt``; ``None``: stdout (stream mode)."""
    echo: bool = False
    """Stream mode with ``out_dir``: also copy every line to stdout."""
    ring: int | None = None
    """Keep only the last N events per thread (1 to :data:`MAX_RING`) in memory and write them on dumps."""
    idle_dump: float | None = None
    """Ring mode: dump when no new event arrived for this many seconds."""
    dump_signals: tuple[signal.Signals, ...] | None | str = "default"
    """Ring mode: signals that dump (``"default"``: SIGTERM and SIGUSR1; ``None``: none)."""
    flush_interval: float = 0.5
    """Stream mode with a file: seconds between flushes by the watchdog thread (0: never)."""
    backend: str = "auto"
    """``settrace``, ``monitoring`` (Python 3.12+) or ``auto`` (monitoring where it exists)."""
    line_format: str = "nicer"
    """``nicer`` (dotted names, ms time stamps, thread tags) or ``seed`` (the handbook's format)."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise once, here
        set_(self, "ignoremods", _as_tuple(self.ignoremods))
        set_(self, "ignoredirs", tuple(os.path.normpath(d) for d in _as_tuple(self.ignoredirs)))
        set_(self, "packages_to_include", _normalise_packages(self.packages_to_include))
        ring, trace_ = self.ring, self.trace
        if ring is not None and (not isinstance(ring, int) or not 1 <= ring <= MAX_RING):
            raise ValueError(f"ring must be 1 to {MAX_RING} events per thread, got {ring!r}")
        if ring is not None and not trace_:
            raise ValueError("ring needs trace=1: it keeps the last traced events")
        if needs_ring(ring, self.idle_dump) or (self.idle_dump is not None and self.idle_dump <= 0):
            raise ValueError("idle_dump needs ring=N and a positive number of seconds")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be auto, settrace or monitoring, not {self.backend!r}")
        if self.backend == "monitoring" and not hasattr(sys, "monitoring"):
            raise ValueError("backend='monitoring' needs Python 3.12 or newer")
        if self.line_format not in LINE_FORMATS:
            raise ValueError(f"line_format must be nicer or seed, not {self.line_format!r}")
        signals: Iterable[int] | None | str = self.dump_signals
        if isinstance(signals, str):
            if signals != "default":
                raise ValueError(f"dump_signals: expected signals, None or 'default', not {signals!r}")
            signals = (signal.SIGTERM, signal.SIGUSR1) if ring else ()
        set_(self, "dump_signals", tuple(signal.Signals(s) for s in (signals or ())))
        for sig in self.signals:
            if sig in UNCATCHABLE:
                raise ValueError(f"dump_signals: {sig.name} cannot be caught, so it cannot trigger a dump")
        set_(self, "out_dir", os.fspath(self.out_dir) if self.out_dir is not None else None)

    @property
    def signals(self) -> tuple[signal.Signals, ...]:
        """``dump_signals`` after normalisation (always a tuple)."""
        return self.dump_signals  # type: ignore[return-value]

    def as_kwargs(self) -> dict[str, Any]:
        """The fields as keyword arguments for ``NicerTrace(**...)``."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
