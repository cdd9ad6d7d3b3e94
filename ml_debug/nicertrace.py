"""NicerTrace: what did this process do last? A drop-in :class:`trace.Trace` for hangs.

``NicerTrace`` keeps the standard library's ``trace.Trace`` constructor and methods (``run``,
``runctx``, ``runfunc``, ``results``, ``counts``) and adds what a person debugging a silent
rank needs::

    from ml_debug.nicertrace import NicerTrace

    tracer = NicerTrace(packages_to_include=["mypkg"], out_dir="traces", ring=10_000, idle_dump=30)
    tracer.runfunc(main)          # or: with tracer: main()

* ``packages_to_include``: ``None`` traces everything (like ``trace.Trace``); ``"uninstalled"``
  (or ``[]``) traces only code outside site-packages and the standard library (your scripts and
  ``pip install -e`` checkouts); ``["torch", "json"]`` traces that code plus the named top-level
  packages. ``ignoredirs`` / ``ignoremods`` still exclude on top (a single directory works too).
* One file per process, ``trace-{host}-{rank}-{pid}.txt`` in ``out_dir`` (rank from ``RANK``,
  ``SLURM_PROCID``, ``OMPI_COMM_WORLD_RANK`` or ``PMI_RANK``; ``na`` without one). Forked children
  get their own file. Without ``out_dir`` the trace goes to stdout, as ``trace.Trace`` does.
* Lines: ``0:00:01.234 --> /home/me/proj/train.py:12 Trainer.step`` for a call into your own code
  (its file as Python knows it, usually the full path), ``--> json.encoder:182 JSONEncoder.encode``
  for installed and standard-library code (the dotted module name), always with the function's
  first line; ``0:00:01.235     train.py:13: source`` for a line. The elapsed time is on every line
  when ``timing`` (the default here) is on; ``log_pids`` adds ``[pid N]``; threads other than the
  main one are marked ``{thread-name}``.
* ``line_format="seed"`` writes the seed's format instead, for tools that parse it (see
  :class:`~ml_debug.tracing.formats.SeedFormat`).
* ``ring=N`` keeps only the last N events per thread in memory and writes them when tracing stops,
  at exit, on ``dump_signals`` (default SIGTERM and SIGUSR1; SIGUSR1/2 dump and keep running) and
  when no new event arrived for ``idle_dump`` seconds: the last moments, not gigabytes.

All settings also come as one :class:`~ml_debug.tracing.options.TraceOptions` dataclass:
``NicerTrace.from_options(TraceOptions(ring=10_000))``; ``tracer.options`` holds them.

Cost: code that is not traced costs one dictionary lookup per call under ``sys.settrace``
(the global trace function returns ``None``, so no per-line tracer is installed), and nothing at
all on Python 3.12+, where ``sys.monitoring`` disables its start event per code object.

Standard library only (no torch, no rich): safe to import into any training script. Its parts
live in :mod:`ml_debug.tracing` (filter, formats, threads, sinks, backends, watchdog, forking).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import trace
from collections.abc import Callable, Iterable
from typing import Any

from ml_debug.tracing import forking
from ml_debug.tracing.backends import MonitoringBackend, SettraceBackend, free_tool_id, make_localtrace
from ml_debug.tracing.filter import TraceFilter
from ml_debug.tracing.formats import FORMATS, EventText
from ml_debug.tracing.identity import RANK_VARS, Header, detect_rank, format_elapsed, trace_file_name
from ml_debug.tracing.options import TraceOptions
from ml_debug.tracing.sinks import RingSink, StreamSink
from ml_debug.tracing.threads import WATCHDOG_NAME, ThreadState, ThreadTable
from ml_debug.tracing.watchdog import SignalDumps, Watchdog

__all__ = ["NicerTrace", "TraceOptions", "trace_file_name", "detect_rank", "format_elapsed",
           "RANK_VARS", "WATCHDOG_NAME"]

# Settings readable as tracer attributes, as before they moved into `options`.
_OPTION_ATTRS = frozenset({"packages_to_include", "log_pids", "out_dir", "echo", "ring", "idle_dump",
                           "dump_signals", "flush_interval", "line_format"})


class NicerTrace(trace.Trace):
    """``trace.Trace`` with package filters, per-process files, time stamps and a ring buffer.

    Same positional parameters as ``trace.Trace`` (``timing`` defaults to True here); the
    keyword-only ones are NicerTrace's own. Every parameter is a field of
    :class:`~ml_debug.tracing.options.TraceOptions`, documented there. Shell equivalent:
    ``python -m trace -t --timing``.
    """

    def __init__(self, count: int = 1, trace: int = 1, countfuncs: int = 0, countcallers: int = 0,
                 ignoremods: Iterable[str] | str = (), ignoredirs: Iterable[str] | str = (),
                 infile: str | None = None, outfile: str | None = None, timing: bool = True, *,
                 packages_to_include: Iterable[str] | str | None = None, log_pids: bool = False,
                 out_dir: str | os.PathLike[str] | None = None, echo: bool = False,
                 ring: int | None = None, idle_dump: float | None = None,
                 dump_signals: Iterable[int] | None | str = "default", flush_interval: float = 0.5,
                 backend: str = "auto", line_format: str = "nicer") -> None:
        opts = TraceOptions(
            count=count, trace=trace, countfuncs=countfuncs, countcallers=countcallers,
            ignoremods=ignoremods, ignoredirs=ignoredirs, infile=infile, outfile=outfile,  # type: ignore[arg-type]
            timing=timing, packages_to_include=packages_to_include, log_pids=log_pids,  # type: ignore[arg-type]
            out_dir=out_dir, echo=echo, ring=ring, idle_dump=idle_dump, dump_signals=dump_signals,  # type: ignore[arg-type]
            flush_interval=flush_interval, backend=backend, line_format=line_format)
        super().__init__(count, trace, countfuncs, countcallers, list(opts.ignoremods), list(opts.ignoredirs),
                         infile, outfile, timing)
        self.options = opts
        # countfuncs / countcallers keep the standard implementation (they print nothing per event).
        self._ours = bool(trace or count) and not (countfuncs or countcallers)
        want_mon = backend == "monitoring" or (backend == "auto" and hasattr(sys, "monitoring"))
        self.backend = "monitoring" if (want_mon and self._ours) else "settrace"
        self._clock = time.monotonic
        self._t0 = self.start_time if self.start_time is not None else self._clock()
        self._start_unix = time.time() - (self._clock() - self._t0)
        timing_on = self.start_time is not None
        self._fmt = FORMATS[opts.line_format]
        self._sink: StreamSink | RingSink = (
            RingSink(opts.ring, self._fmt, self._clock, self._t0, timing_on) if opts.ring
            else StreamSink(self._fmt, self._clock, self._t0, timing_on, opts.echo))
        self._text = EventText(TraceFilter(opts.packages_to_include, opts.ignoremods, opts.ignoredirs),
                               self._fmt)
        self._threads = ThreadTable(self._attach)
        self._settrace = SettraceBackend(self._text, self._threads)
        self._monitoring = (MonitoringBackend(self._text, self._threads, self.counts, bool(count))
                            if hasattr(sys, "monitoring") else None)
        self._signals = SignalDumps(opts.signals, self._dump)
        self._watchdog = Watchdog(dump=self._dump, flush=self._sink.flush_file, signals=self._signals,
                                  ring=bool(opts.ring), idle_dump=opts.idle_dump,
                                  flush_interval=opts.flush_interval, last_events=self._last_events,
                                  clock=self._clock)
        self._header = Header(self._start_unix)
        self._path: str | None = None
        self._active = False
        if self._ours:
            self.globaltrace = self._settrace.globaltrace

    @classmethod
    def from_options(cls, options: TraceOptions) -> NicerTrace:
        """The tracer for these settings (the same as passing each field as a keyword)."""
        return cls(**options.as_kwargs())

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not found normally: the settings, read from `options`.
        if name in _OPTION_ATTRS and "options" in self.__dict__:
            value = getattr(self.options, name)
            return list(value) if name == "packages_to_include" and value is not None else value
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ---------------------------------------------------------------- public API

    @property
    def path(self) -> str | None:
        """The per-process trace file (None when tracing to stdout)."""
        return self._path

    def run(self, cmd: Any) -> None:
        super().run(cmd)

    def runctx(self, cmd: Any, globals: dict[str, Any] | None = None,  # type: ignore[override]
               locals: dict[str, Any] | None = None) -> None:
        self._activate()
        try:
            if self.backend == "monitoring":
                mon = self._monitoring
                assert mon is not None
                mon.start()
                try:
                    exec(cmd, {} if globals is None else globals, {} if locals is None else locals)
                finally:
                    mon.stop()
            else:
                super().runctx(cmd, globals, locals)
        finally:
            self._deactivate("end")

    def runfunc(self, func: Callable[..., Any], /, *args: Any, **kw: Any) -> Any:
        self._activate()
        try:
            if self.backend == "monitoring":
                mon = self._monitoring
                assert mon is not None
                mon.start()
                try:
                    return func(*args, **kw)
                finally:
                    mon.stop()
            old = threading.gettrace()
            if not self.donothing:
                threading.settrace(self.globaltrace)  # threads the function starts are traced too
            try:
                # The standard runfunc calls func, so callers-tracking still sees Trace.runfunc.
                return super().runfunc(func, *args, **kw)
            finally:
                threading.settrace(old)
        finally:
            self._deactivate("end")

    def start(self) -> None:
        """Trace from here on (this thread and threads started later) until :meth:`stop`."""
        self._activate()
        if self.backend == "monitoring":
            assert self._monitoring is not None
            self._monitoring.start()
        elif not self.donothing:
            threading.settrace(self.globaltrace)
            sys.settrace(self.globaltrace)

    def stop(self) -> None:
        """Stop tracing; in ring mode this writes the last events."""
        if self.backend == "monitoring":
            assert self._monitoring is not None
            self._monitoring.stop()
        else:
            sys.settrace(None)
            threading.settrace(None)
        self._deactivate("end")

    def __enter__(self) -> NicerTrace:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def dump(self, reason: str = "request") -> str | None:
        """Write the ring buffer now (or flush the stream); returns the file written."""
        return self._dump(reason)

    # ---------------------------------------------------------------- wiring

    def _attach(self, st: ThreadState) -> None:
        """Give a thread seen for the first time its recording functions."""
        if self.options.trace:
            self._sink.attach(st)  # count-only: nothing is written
        st.localtrace = make_localtrace(st, self._text, self.counts, bool(self.options.count))

    def _last_events(self) -> list[Any]:
        """Each ring's newest event, for the watchdog's idle check."""
        return [st.ring[-1] if st.ring else None for st in self._threads.recording()]

    def _open_outputs(self, extra: str = "") -> None:
        opts = self.options
        self._header = Header(self._start_unix, extra + self._fmt.header_extra)
        self._sink.pfx[0] = self._fmt.pid_prefix(os.getpid()) if opts.log_pids else ""
        self._path = None
        sink = self._sink
        if opts.out_dir is None and isinstance(sink, StreamSink):
            sink.to_stdout()
            return
        directory = opts.out_dir or "."
        os.makedirs(directory, exist_ok=True)
        self._path = os.path.join(os.path.abspath(directory), trace_file_name())
        if isinstance(sink, RingSink):
            return
        if not opts.trace:
            self._path = None
            return
        sink.open(self._path, self._header.line("stream"))

    def _activate(self) -> None:
        if self._active:
            return
        self._active = True
        if not self._ours:
            return
        if self.backend == "monitoring" and free_tool_id() is None:
            self.backend = "settrace"  # debuggers/profilers hold every sys.monitoring id
        self._threads.main_ident = threading.main_thread().ident
        self._open_outputs()
        forking.track(self)
        self._signals.install()
        if self._watchdog.wanted(self._sink.buffered):
            self._watchdog.start()

    def _deactivate(self, reason: str) -> None:
        if not self._active:
            return
        self._active = False
        if not self._ours:
            return
        forking.untrack(self)
        self._watchdog.stop()
        self._signals.restore()
        if isinstance(self._sink, RingSink):
            self._dump(reason)
        else:
            self._sink.close()

    def _dump(self, reason: str) -> str | None:
        """Ring: write the last events per thread (main thread last). Stream: flush."""
        sink = self._sink
        if isinstance(sink, StreamSink):
            sink.flush()
            return self._path
        if self._path is None:
            return None
        return sink.dump(self._path, self._header.line(f"ring({sink.size})"), reason,
                         self._threads.recording(), self._threads.main_ident)

    # ---------------------------------------------------------------- fork and exit (see tracing.forking)

    def _after_fork_child(self) -> None:
        """A forked child gets its own file and ring, and its own watchdog."""
        # The tracer's own work below is not the program's: the stream records none of it until
        # resume(), and the thread table empties the ring of it.
        self._sink.forget_file()
        self._watchdog.forget()
        self._open_outputs(extra=f" forked_from={os.getppid()}")
        if self._watchdog.wanted(self._sink.buffered):  # ring dumps (a stream child writes each line)
            self._watchdog.start()
        self._threads.after_fork_child()
        self._sink.resume()

    def _before_fork(self) -> None:
        self._sink.flush_file()

    def _atexit(self) -> None:
        if self._active:
            self._dump("exit")
            self._sink.flush_file()
