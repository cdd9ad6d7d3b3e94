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
* Lines: ``0:00:01.234 --> pkg.module:12 Class.method`` for a call (dotted module name and the
  function's first line) and ``0:00:01.235     module.py:13: source`` for a line; the elapsed time
  is on every line when ``timing`` (the default here) is on; ``log_pids`` adds ``[pid N]``;
  threads other than the main one are marked ``{thread-name}``.
* ``ring=N`` keeps only the last N events per thread in memory and writes them when tracing stops,
  at exit, on ``dump_signals`` (default SIGTERM and SIGUSR1; SIGUSR1/2 dump and keep running) and
  when no new event arrived for ``idle_dump`` seconds: the last moments, not gigabytes.

Cost: code that is not traced costs one dictionary lookup per call under ``sys.settrace``
(the global trace function returns ``None``, so no per-line tracer is installed), and nothing at
all on Python 3.12+, where ``sys.monitoring`` disables its start event per code object.

Standard library only (no torch, no rich): it can be copied next to a script as is.
"""

from __future__ import annotations

import atexit
import linecache
import os
import signal
import socket
import sys
import sysconfig
import threading
import time
import trace
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["NicerTrace", "trace_file_name", "detect_rank"]

RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
WATCHDOG_NAME = "mldebug-nicertrace-watchdog"
# Signals whose default action is not worth dying for: dump a snapshot and keep running.
_SNAPSHOT_SIGNALS = {getattr(signal, n) for n in ("SIGUSR1", "SIGUSR2") if hasattr(signal, n)}
_SIGNAMES = {s.value: s.name for s in signal.Signals}  # the dump path must not call enum code
_DEFAULT = object()
_MISSING = object()


def detect_rank() -> str:
    """The global rank from the launcher's environment, or ``"na"``."""
    for var in RANK_VARS:
        value = os.environ.get(var, "").strip()
        if value.isdigit():
            return value
    return "na"


def trace_file_name(pid: int | None = None, host: str | None = None, rank: str | None = None) -> str:
    """``trace-{host}-{rank}-{pid}.txt`` for this process (or the given parts)."""
    host = host if host is not None else socket.gethostname()
    host = "".join(c if c.isalnum() or c in ".-_" else "_" for c in host) or "unknown"
    return f"trace-{host}-{rank if rank is not None else detect_rank()}-{pid if pid is not None else os.getpid()}.txt"


def format_elapsed(seconds: float) -> str:
    """``H:MM:SS.mmm``: readable when a job has run for hours."""
    ms = int(seconds * 1000)
    s, ms = divmod(ms, 1000)
    m, s = divmod(s, 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}.{ms:03d}"


def _real(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


def _python_dirs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(site-packages dirs, standard-library dirs), real paths, longest first."""
    site_dirs: set[str] = set()
    std_dirs: set[str] = set()
    for paths in (sysconfig.get_paths(),
                  sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix,
                                            "installed_base": sys.base_prefix,
                                            "installed_platbase": sys.base_exec_prefix})):
        site_dirs.update(paths[k] for k in ("purelib", "platlib") if paths.get(k))
        std_dirs.update(paths[k] for k in ("stdlib", "platstdlib") if paths.get(k))
    try:
        import site

        site_dirs.update(site.getsitepackages())
        site_dirs.add(site.getusersitepackages())
    except Exception:  # a stripped-down site module (embedded Pythons) has neither
        pass
    site_dirs.update(p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages"))

    def norm(dirs: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted({_real(d) for d in dirs if d}, key=len, reverse=True))

    return norm(site_dirs), norm(std_dirs)


def _own_code() -> tuple[frozenset[str], tuple[str, ...]]:
    """Files of the tracer itself: never traced (its dump code must not record itself)."""
    here = os.path.dirname(_real(__file__))
    files = frozenset({_real(__file__), os.path.join(here, "cli", "trace.py")})
    return files, (os.path.join(here, "tracing") + os.sep,)


def _normalise_packages(packages: Any) -> list[str] | None:
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
    return names


def _as_list(value: Any) -> list[str]:
    if not value:
        return []
    if isinstance(value, (str, os.PathLike)):
        return [os.fspath(value)]  # one directory or module, not its characters
    return [os.fspath(v) for v in value]


class NicerTrace(trace.Trace):
    """``trace.Trace`` with package filters, per-process files, time stamps and a ring buffer.

    Same positional parameters as ``trace.Trace`` (``timing`` defaults to True here); the
    keyword-only ones are NicerTrace's own. Shell equivalent: ``python -m trace -t --timing``.
    """

    def __init__(self, count: int = 1, trace: int = 1, countfuncs: int = 0, countcallers: int = 0,
                 ignoremods: Iterable[str] | str = (), ignoredirs: Iterable[str] | str = (),
                 infile: str | None = None, outfile: str | None = None, timing: bool = True, *,
                 packages_to_include: Iterable[str] | str | None = None, log_pids: bool = False,
                 out_dir: str | os.PathLike[str] | None = None, echo: bool = False,
                 ring: int | None = None, idle_dump: float | None = None,
                 dump_signals: Iterable[int] | None | object = _DEFAULT, flush_interval: float = 0.5,
                 backend: str = "auto") -> None:
        ignoremods_l = _as_list(ignoremods)
        ignoredirs_l = [os.path.normpath(d) for d in _as_list(ignoredirs)]
        super().__init__(count, trace, countfuncs, countcallers, ignoremods_l, ignoredirs_l,
                         infile, outfile, timing)
        if ring is not None and (not isinstance(ring, int) or ring < 1):
            raise ValueError(f"ring must be a positive number of events, got {ring!r}")
        if ring is not None and not trace:
            raise ValueError("ring needs trace=1: it keeps the last traced events")
        if idle_dump is not None and (ring is None or idle_dump <= 0):
            raise ValueError("idle_dump needs ring=N and a positive number of seconds")
        if backend not in ("auto", "settrace", "monitoring"):
            raise ValueError(f"backend must be auto, settrace or monitoring, not {backend!r}")
        if backend == "monitoring" and not hasattr(sys, "monitoring"):
            raise ValueError("backend='monitoring' needs Python 3.12 or newer")
        self.packages_to_include = _normalise_packages(packages_to_include)
        self.log_pids = bool(log_pids)
        self.out_dir = os.fspath(out_dir) if out_dir is not None else None
        self.echo = bool(echo)
        self.ring = ring
        self.idle_dump = idle_dump
        if dump_signals is _DEFAULT:
            dump_signals = (signal.SIGTERM, signal.SIGUSR1) if ring else ()
        self.dump_signals = tuple(signal.Signals(s) for s in (dump_signals or ()))  # type: ignore[union-attr]
        self.flush_interval = flush_interval
        # countfuncs / countcallers keep the standard implementation (they print nothing per event).
        self._ours = bool(trace or count) and not (countfuncs or countcallers)
        self._count = bool(count)
        self._trace = bool(trace)
        want_mon = backend == "monitoring" or (backend == "auto" and hasattr(sys, "monitoring"))
        self.backend = "monitoring" if (want_mon and self._ours) else "settrace"
        self._ignoremods = tuple(ignoremods_l)
        self._ignoredirs = tuple(_real(d) + os.sep for d in ignoredirs_l)
        self._site_dirs, self._std_dirs = _python_dirs()
        self._own_files, self._own_dirs = _own_code()
        self._clock = time.monotonic
        self._t0 = self.start_time if self.start_time is not None else self._clock()
        self._start_unix = time.time() - (self._clock() - self._t0)
        self._heads: dict[Any, str | None] = {}  # code object -> call line body, or None: not traced
        self._bodies: dict[tuple[str, int], str] = {}  # (file, line) -> line body
        self._threads: dict[int, Any] = {}  # thread ident -> per-thread state (False: never trace)
        self._rings: dict[int, tuple[list[str], deque[tuple[float, str]]]] = {}
        self._out: list[Callable[[str], Any]] = [sys.stdout.write]
        self._pfx = [""]
        self._file: Any = None
        self._path: str | None = None
        self._active = False
        self._lock = threading.RLock()
        self._watchdog: threading.Thread | None = None
        self._wd_pipe: tuple[int, int] | None = None
        self._old_wakeup = -1
        self._old_handlers: dict[int, Any] = {}
        self._handled: dict[int, int] = {}
        self._dumps = 0
        self._mon_tool: int | None = None
        self._mon_codes: list[Any] = []
        self._jump_lines: dict[tuple[Any, int], int] = {}
        self._main_ident = threading.main_thread().ident
        if self._ours:
            self.globaltrace = self._globaltrace

    # ---------------------------------------------------------------- public API

    @property
    def path(self) -> str | None:
        """The per-process trace file (None when tracing to stdout)."""
        return self._path

    def run(self, cmd: Any) -> None:
        super().run(cmd)

    def runctx(self, cmd: Any, globals: dict[str, Any] | None = None,
               locals: dict[str, Any] | None = None) -> None:
        self._activate()
        try:
            if self.backend == "monitoring":
                self._mon_start()
                try:
                    exec(cmd, {} if globals is None else globals, {} if locals is None else locals)
                finally:
                    self._mon_stop()
            else:
                super().runctx(cmd, globals, locals)
        finally:
            self._deactivate("end")

    def runfunc(self, func: Callable[..., Any], /, *args: Any, **kw: Any) -> Any:
        self._activate()
        try:
            if self.backend == "monitoring":
                self._mon_start()
                try:
                    return func(*args, **kw)
                finally:
                    self._mon_stop()
            old = threading.gettrace()
            if not self.donothing:
                threading.settrace(self.globaltrace)  # threads the function starts are traced too
            try:
                # The standard runfunc calls func, so callers-tracking still sees Trace.runfunc.
                return super().runfunc(func, *args, **kw)
            finally:
                threading.settrace(old)  # type: ignore[arg-type]
        finally:
            self._deactivate("end")

    def start(self) -> None:
        """Trace from here on (this thread and threads started later) until :meth:`stop`."""
        self._activate()
        if self.backend == "monitoring":
            self._mon_start()
        elif not self.donothing:
            threading.settrace(self.globaltrace)
            sys.settrace(self.globaltrace)

    def stop(self) -> None:
        """Stop tracing; in ring mode this writes the last events."""
        if self.backend == "monitoring":
            self._mon_stop()
        else:
            sys.settrace(None)
            threading.settrace(None)  # type: ignore[arg-type]
        self._deactivate("end")

    def __enter__(self) -> NicerTrace:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def dump(self, reason: str = "request") -> str | None:
        """Write the ring buffer now (or flush the stream); returns the file written."""
        return self._dump(reason)

    # ---------------------------------------------------------------- filtering

    def _decide(self, code: Any, globals_: dict[str, Any] | None) -> str | None:
        """The call-line body for a code object, or None when it is not traced.

        As in trace.Trace, code whose module has no ``__file__`` (namedtuple's generated
        methods, ``python -c``) is not traced; code compiled from a string inside a module
        (``<string>``) is judged by that module's file.
        """
        filename = code.co_filename or ""
        module = globals_.get("__name__") if globals_ is not None else None
        if module == "__main__" and globals_ is not None:
            # `python -m pkg.mod` / `mldebug trace -m pkg.mod`: the spec keeps the real name.
            module = getattr(globals_.get("__spec__"), "name", None) or module
        gfile = globals_.get("__file__") if globals_ is not None else None
        head = None
        if isinstance(gfile, str) and gfile:
            where = filename if (filename and not filename.startswith("<")) else gfile
            if self._included(where, module):
                head = self._head(code, filename, module)
        self._heads[code] = head
        return head

    def _included(self, filename: str, module: str | None) -> bool:
        real = _real(filename)
        if real in self._own_files or real.startswith(self._own_dirs):
            return False
        kind, top = "user", (module or "").split(".")[0]
        for kind_name, roots in (("site", self._site_dirs), ("stdlib", self._std_dirs)):
            root = next((r for r in roots if real.startswith(r + os.sep)), None)
            if root is not None:
                kind, top = kind_name, real[len(root) + 1:].split(os.sep)[0].split(".")[0]
                break
        if real.startswith(self._ignoredirs):
            return False
        if self.packages_to_include is not None and kind != "user" and top not in self.packages_to_include:
            return False
        if self._ignoremods:
            names = {os.path.splitext(os.path.basename(filename))[0]}
            if module:
                names.add(module)
            for mod in self._ignoremods:
                if any(n == mod or n.startswith(mod + ".") for n in names):
                    return False
        return True

    @staticmethod
    def _head(code: Any, filename: str, module: str | None) -> str:
        where = filename if module in (None, "__main__") else module
        return f"--> {where}:{code.co_firstlineno} {getattr(code, 'co_qualname', code.co_name)}"

    def _body(self, key: tuple[str, int]) -> str:
        filename, lineno = key
        source = linecache.getline(filename, lineno).strip()
        body = self._bodies[key] = f"    {os.path.basename(filename)}:{lineno}: {source}"
        return body

    # ---------------------------------------------------------------- per-thread state

    def _tag(self, ident: int) -> str | None:
        """"" for the main thread, "{name} " for others, None while the thread is not registered.

        Reads threading's registry without calling into it (the dump path must stay untraced).
        """
        if ident == self._main_ident:
            return ""
        thread = threading._active.get(ident)  # type: ignore[attr-defined]
        if thread is None:
            return None
        return "{" + str(thread._name).replace("}", ")") + "} "

    def _thread_state(self, ident: int) -> Any:
        """(emit(body), local tracer) for a thread, or False for the tracer's own watchdog."""
        tag = self._tag(ident)
        if tag == "{" + WATCHDOG_NAME + "} ":
            self._threads[ident] = False
            return False
        # On 3.12+ a new thread's first events come before threading registers it: name it later.
        tagc = [tag if tag is not None else f"{{thread-{ident}}} "]
        known = [tag is not None]
        clock, t0, pfx, out, timing = self._clock, self._t0, self._pfx, self._out, self.start_time is not None
        if self.ring:
            ring: deque[tuple[float, str]] = deque(maxlen=self.ring)
            self._rings[ident] = (tagc, ring)
            append = ring.append

            def emit(body: str) -> None:
                if not known[0]:
                    tag = self._tag(ident)
                    if tag is not None:
                        tagc[0], known[0] = tag, True
                append((clock(), body))
        elif self._trace:
            def emit(body: str) -> None:
                if not known[0]:
                    tag = self._tag(ident)
                    if tag is not None:
                        tagc[0], known[0] = tag, True
                if timing:
                    out[0](f"{format_elapsed(clock() - t0)} {pfx[0]}{tagc[0]}{body}\n")
                else:
                    out[0](f"{pfx[0]}{tagc[0]}{body}\n")
        else:
            emit = None  # type: ignore[assignment]

        bodies, counts, counting, make_body = self._bodies, self.counts, self._count, self._body

        def localtrace(frame: Any, why: str, arg: Any) -> Any:
            if why == "line":
                key = (frame.f_code.co_filename, frame.f_lineno)
                if counting:
                    counts[key] = counts.get(key, 0) + 1
                if emit is not None:
                    emit(bodies.get(key) or make_body(key))
            return localtrace

        state = (emit, localtrace)
        self._threads[ident] = state
        return state

    def _globaltrace(self, frame: Any, why: str, arg: Any) -> Any:
        # Called for every new frame: the excluded path is one dict lookup and `return None`,
        # so excluded code never gets a per-line tracer.
        code = frame.f_code
        head = self._heads.get(code, _MISSING)
        if head is _MISSING:
            head = self._decide(code, frame.f_globals)
        if head is None:
            return None
        ident = threading.get_ident()
        state = self._threads.get(ident)
        if state is None:
            state = self._thread_state(ident)
        if state is False:
            return None
        if state[0] is not None:
            state[0](head)
        return state[1]

    # ---------------------------------------------------------------- sys.monitoring (3.12+)

    @staticmethod
    def _free_tool_id() -> int | None:
        mon = sys.monitoring  # type: ignore[attr-defined]
        return next((t for t in (4, 3, 5, 2, 1, 0) if mon.get_tool(t) is None), None)

    def _mon_start(self) -> None:
        mon = sys.monitoring  # type: ignore[attr-defined]
        tool = self._free_tool_id()
        if tool is None:  # _activate checked; another tool took the last id since
            raise RuntimeError("every sys.monitoring tool id is taken; use backend='settrace'")
        mon.use_tool_id(tool, "mldebug-nicertrace")
        self._mon_tool = tool
        ev = mon.events
        mon.register_callback(tool, ev.PY_START, self._mon_call)
        mon.register_callback(tool, ev.PY_RESUME, self._mon_call)
        mon.register_callback(tool, ev.LINE, self._mon_line)
        mon.register_callback(tool, ev.JUMP, self._mon_jump)
        mon.restart_events()  # code disabled by an earlier tracer must be seen again
        mon.set_events(tool, ev.PY_START | ev.PY_RESUME)

    def _mon_stop(self) -> None:
        tool = self._mon_tool
        if tool is None:
            return
        mon = sys.monitoring  # type: ignore[attr-defined]
        mon.set_events(tool, 0)
        for code in self._mon_codes:
            try:
                mon.set_local_events(tool, code, 0)
            except ValueError:
                pass
        self._mon_codes.clear()
        for event in (mon.events.PY_START, mon.events.PY_RESUME, mon.events.LINE, mon.events.JUMP):
            mon.register_callback(tool, event, None)
        mon.free_tool_id(tool)
        self._mon_tool = None

    def _mon_call(self, code: Any, offset: int) -> Any:
        head = self._heads.get(code, _MISSING)
        if head is _MISSING:
            frame = sys._getframe(1)
            head = self._decide(code, frame.f_globals if frame.f_code is code else None)
            if head is not None:
                ev = sys.monitoring.events  # type: ignore[attr-defined]
                sys.monitoring.set_local_events(self._mon_tool, code, ev.LINE | ev.JUMP)  # type: ignore[attr-defined]
                self._mon_codes.append(code)
        if head is None:
            return sys.monitoring.DISABLE  # type: ignore[attr-defined]  # never again for this code
        ident = threading.get_ident()
        state = self._threads.get(ident)
        if state is None:
            state = self._thread_state(ident)
        if state is not False and state[0] is not None:
            state[0](head)
        return None

    def _mon_line(self, code: Any, line: int) -> Any:
        ident = threading.get_ident()
        state = self._threads.get(ident)
        if state is None:
            state = self._thread_state(ident)
        if state is False:
            return None
        key = (code.co_filename, line)
        if self._count:
            self.counts[key] = self.counts.get(key, 0) + 1
        if state[0] is not None:
            state[0](self._bodies.get(key) or self._body(key))
        return None

    def _mon_jump(self, code: Any, offset: int, destination: int) -> Any:
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
        return self._mon_line(code, line)

    # ---------------------------------------------------------------- output, dumps, signals

    def _header(self, mode: str) -> str:
        # Built from parts computed at start (and after fork): a dump must not run library code
        # that the tracer itself would record.
        return f"# nicertrace {self._ident_part} mode={mode}{self._header_tail}"

    def _set_identity(self, extra: str = "") -> None:
        argv = " ".join(sys.argv)[:300]
        self._ident_part = (f"pid={os.getpid()} host={socket.gethostname()} rank={detect_rank()} "
                            f"start_unix={self._start_unix:.6f} python={sys.version.split()[0]}")
        self._header_tail = f"{extra} argv={argv}\n"

    def _open_outputs(self, extra: str = "") -> None:
        self._set_identity(extra)
        self._pfx[0] = f"[pid {os.getpid()}] " if self.log_pids else ""
        self._path = None
        if self.out_dir is None and not self.ring:
            self._out[0] = lambda s: sys.stdout.write(s)  # the current stdout, as trace.Trace prints
            return
        directory = self.out_dir or "."
        os.makedirs(directory, exist_ok=True)
        self._path = os.path.join(os.path.abspath(directory), trace_file_name())
        if self.ring:
            return
        if not self._trace:
            self._path = None
            return
        f = open(self._path, "a", encoding="utf-8", errors="replace")  # noqa: SIM115
        f.write(self._header("stream"))
        f.flush()
        self._file = f
        if self.echo:
            def tee(s: str, _w: Callable[[str], Any] = f.write) -> None:
                _w(s)
                sys.stdout.write(s)

            self._out[0] = tee
        else:
            self._out[0] = f.write

    def _activate(self) -> None:
        if self._active:
            return
        self._active = True
        if not self._ours:
            return
        if self.backend == "monitoring" and self._free_tool_id() is None:
            self.backend = "settrace"  # debuggers/profilers hold every sys.monitoring id
        self._main_ident = threading.main_thread().ident
        self._open_outputs()
        _ACTIVE.add(self)
        _ensure_hooks()
        self._install_signals()
        self._start_watchdog()

    def _deactivate(self, reason: str) -> None:
        if not self._active:
            return
        self._active = False
        if not self._ours:
            return
        _ACTIVE.discard(self)
        self._stop_watchdog()
        self._restore_signals()
        if self.ring:
            self._dump(reason)
        elif self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
            self._out[0] = sys.stdout.write

    def _dump(self, reason: str) -> str | None:
        """Ring: write the last events per thread (main thread last). Stream: flush."""
        if not self.ring:
            try:
                if self._file is not None:
                    self._file.flush()
                else:
                    sys.stdout.flush()
            except (OSError, ValueError):
                pass
            return self._path
        if self._path is None:
            return None
        with self._lock:
            self._dumps += 1
            now = self._clock()
            rings = list(self._rings.items())  # copied in C: other threads may add rings meanwhile
            rings.sort(key=lambda kv: kv[0] == self._main_ident)
            lines = [self._header(f"ring({self.ring})"),
                     f"# dump reason={reason} at={format_elapsed(now - self._t0)} "
                     f"threads={len(rings)}\n"]
            pfx = self._pfx[0]
            timing = self.start_time is not None
            for ident, (tagc, ring) in rings:
                tag = tagc[0]
                if tag == "{" + WATCHDOG_NAME + "} ":
                    continue
                events = list(ring)
                lines.append(f"# thread {tag.strip() or '{main}'} ident={ident} last {len(events)} events\n")
                for t, body in events:
                    stamp = f"{format_elapsed(t - self._t0)} " if timing else ""
                    lines.append(f"{stamp}{pfx}{tag}{body}\n")
            tmp = f"{self._path}.{os.getpid()}.{self._dumps}.tmp"
            try:
                with open(tmp, "w", encoding="utf-8", errors="replace") as f:
                    f.write("".join(lines))
                os.replace(tmp, self._path)
            except OSError:
                return None
        return self._path

    def _install_signals(self) -> None:
        if not self.dump_signals or threading.current_thread() is not threading.main_thread():
            return
        for sig in self.dump_signals:
            try:
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
            except (OSError, ValueError):
                pass

    def _restore_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, old in self._old_handlers.items():
            try:
                if signal.getsignal(sig) == self._on_signal:
                    signal.signal(sig, old)
            except (OSError, ValueError, TypeError):
                pass
        self._old_handlers.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._dump(f"signal {_SIGNAMES.get(signum, str(signum))}")
        self._handled[signum] = self._handled.get(signum, 0) + 1
        old = self._old_handlers.get(signum, signal.SIG_DFL)
        if callable(old):
            old(signum, frame)
        elif old == signal.SIG_DFL and signum not in _SNAPSHOT_SIGNALS:
            # Die the way the signal would have killed us, now that the tail is on disk.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _start_watchdog(self) -> None:
        """One thread: flushes the stream, notices quiet (idle dump) and signals the main thread
        cannot handle while it is blocked in C (a collective) via the signal wakeup fd."""
        if not (self.ring and (self.idle_dump or self.dump_signals)) and not (self._file and self.flush_interval):
            return
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._wd_pipe = (r, w)
        self._old_wakeup = -1
        if self._old_handlers and threading.current_thread() is threading.main_thread():
            try:
                old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
                if old != -1:  # someone (asyncio) owns it: give it back, Python handlers still work
                    signal.set_wakeup_fd(old)
                else:
                    self._old_wakeup = w
            except (ValueError, OSError):
                pass
        self._wd_ready = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name=WATCHDOG_NAME, daemon=True)
        self._watchdog.start()
        self._wd_ready.wait(5)  # its start-up code runs before tracing starts, so it is not recorded

    def _stop_watchdog(self) -> None:
        if self._wd_pipe is None:
            return
        r, w = self._wd_pipe
        if self._old_wakeup == w and threading.current_thread() is threading.main_thread():
            try:
                signal.set_wakeup_fd(-1)
            except (ValueError, OSError):
                pass
        try:
            os.write(w, b"\0")  # 0 is no signal: it means stop
        except OSError:
            pass
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(timeout=5)
        self._watchdog = None
        for fd in (r, w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wd_pipe = None

    def _watch(self) -> None:
        import select

        sys.settrace(None)
        if self.dump_signals and hasattr(signal, "pthread_sigmask"):
            # Let the kernel deliver them to a thread that runs Python handlers, not to us.
            signal.pthread_sigmask(signal.SIG_BLOCK, self.dump_signals)
        self._wd_ready.set()
        assert self._wd_pipe is not None
        r = self._wd_pipe[0]
        intervals = [self.flush_interval or 1.0]
        if self.idle_dump:
            intervals.append(max(0.05, self.idle_dump / 4))
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
                if signum in self.dump_signals:
                    self._signal_from_watchdog(signum)
            if not self.ring:
                self._dump("flush")
                continue
            if self.idle_dump:
                seen = [ring[-1] if ring else None for _, ring in list(self._rings.values())]
                if len(seen) != len(last_seen) or any(a is not b for a, b in zip(seen, last_seen, strict=True)):
                    last_seen, last_change, idle_dumped = seen, self._clock(), False
                elif not idle_dumped and any(seen) and self._clock() - last_change >= self.idle_dump:
                    self._dump(f"idle {self.idle_dump:g}s")
                    idle_dumped = True

    def _signal_from_watchdog(self, signum: int) -> None:
        handled = self._handled.get(signum, 0)
        deadline = self._clock() + 0.2
        while self._clock() < deadline:  # the main thread handles it if it runs Python code
            if self._handled.get(signum, 0) != handled:
                return
            time.sleep(0.02)
        self._dump(f"signal {_SIGNAMES.get(signum, str(signum))} (main thread blocked)")
        old = self._old_handlers.get(signum, signal.SIG_DFL)
        if old == signal.SIG_DFL and signum not in _SNAPSHOT_SIGNALS:
            deadline = self._clock() + 2.0
            while self._clock() < deadline:
                if self._handled.get(signum, 0) != handled:
                    return
                time.sleep(0.05)
            # Blocked in C for good: the tail is on disk, so end as the signal would have.
            if self._file is not None:
                self._dump("flush")
            os._exit(128 + signum)

    def _after_fork_child(self) -> None:
        """A forked child gets its own file and ring, and its own watchdog."""
        self._main_ident = threading.get_ident()
        for ident in [i for i in self._threads if i != self._main_ident]:
            self._threads.pop(ident, None)
            self._rings.pop(ident, None)
        state = self._threads.get(self._main_ident)
        if state:
            # The forking thread keeps its tracer: re-tag it as the child's main thread.
            self._threads.pop(self._main_ident, None)
            self._rings.pop(self._main_ident, None)
            new_emit, _ = self._thread_state(self._main_ident)
            self._threads[self._main_ident] = (new_emit, state[1])
            _rebind(state[1], new_emit)
        self._file = None
        self._wd_pipe = None
        self._watchdog = None
        self._dumps = 0
        self._open_outputs(extra=f" forked_from={os.getppid()}")
        if self._old_handlers:
            self._start_watchdog()

    def _before_fork(self) -> None:
        if self._file is not None:
            try:
                self._file.flush()
            except (OSError, ValueError):
                pass

    def _atexit(self) -> None:
        if self._active:
            self._dump("exit")
            if self._file is not None:
                try:
                    self._file.flush()
                except (OSError, ValueError):
                    pass


def _rebind(localtrace: Callable[..., Any], emit: Callable[[str], None] | None) -> None:
    """Point an existing per-thread local tracer at a new emit function (after fork)."""
    names = localtrace.__code__.co_freevars
    if "emit" in names and localtrace.__closure__ is not None:
        localtrace.__closure__[names.index("emit")].cell_contents = emit


_ACTIVE: weakref.WeakSet[NicerTrace] = weakref.WeakSet()
_HOOKS: list[bool] = []


def _ensure_hooks() -> None:
    if _HOOKS:
        return
    _HOOKS.append(True)
    atexit.register(lambda: [t._atexit() for t in list(_ACTIVE)])
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(before=lambda: [t._before_fork() for t in list(_ACTIVE)],
                            after_in_child=lambda: [t._after_fork_child() for t in list(_ACTIVE)])
