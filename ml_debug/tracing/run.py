"""Run a script or module under NicerTrace, the way ``python script.py`` / ``python -m mod`` would."""

from __future__ import annotations

import importlib.util
import os
import runpy
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ml_debug.core.errors import UsageError
from ml_debug.nicertrace import NicerTrace
from ml_debug.tracing.identity import trace_file_name

if TYPE_CHECKING:
    from ml_debug.tracing.command_options import TraceCommandOptions


@dataclass
class TraceRun:
    """How a traced program ended (``mldebug trace --json``'s result, ml_debug/schemas/trace.json)."""

    ok: bool
    summary: str
    program: list[str]
    module: bool
    exit_code: int
    trace_file: str | None
    out_dir: str


# NicerTrace's parameters that `mldebug trace` options set: the option to name in an error, and a hint.
_OPTION_OF = {
    "packages_to_include": ("--include", "give top-level package names, e.g. --include torch or -i torch,numpy"),
    "dump_signals": ("--dump-signal", "use a signal that can be caught, e.g. TERM, USR1 or USR2"),
}


def _usage_error(message: str) -> UsageError:
    """NicerTrace's error about a parameter, worded with the `mldebug trace` option that set it."""
    param, sep, rest = message.partition(": ")
    if sep and param in _OPTION_OF:
        option, hint = _OPTION_OF[param]
        return UsageError(f"{option}: {rest}", hint)
    return UsageError(message, "see `mldebug trace --help`")


def parse_signal(name: str) -> signal.Signals:
    """``TERM``, ``SIGTERM`` or ``15`` to a signal."""
    text = name.strip().upper()
    try:
        if text.isdigit():
            return signal.Signals(int(text))
        return signal.Signals[text if text.startswith("SIG") else f"SIG{text}"]
    except (KeyError, ValueError):
        raise UsageError(f"--dump-signal: unknown signal {name!r}", "use a name such as TERM, USR1, INT or HUP") from None


def _find_module(name: str) -> None:
    """A usage error unless ``name`` can be run with ``-m``.

    ``find_spec`` imports the parent packages of a dotted name and raises when one is missing
    (or fails to import) instead of returning None."""
    hint = "is it installed in this Python, in the current directory, or on PYTHONPATH?"
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError as e:
        raise UsageError(f"no module named {e.name or name!r} (for -m {name})", hint) from None
    except Exception as e:  # noqa: BLE001 (a parent package's own import error, as `python -m` reports it)
        raise UsageError(f"cannot find module {name!r}: {type(e).__name__}: {e}",
                         "fix the package's import error; run it with python -m to see the traceback") from None
    if spec is None:
        raise UsageError(f"no module named {name!r}", hint)


def _user_traceback(exc: BaseException, skip_files: set[str]) -> None:
    """Print the traceback without the frames of mldebug, trace and runpy above the user's code."""
    tb = exc.__traceback__
    def ours(name: str) -> bool:
        return name.startswith("<frozen runpy") or os.path.realpath(name) in skip_files

    while tb is not None and ours(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb if tb is not None else exc.__traceback__)


def _planted(path: str, what: str) -> UsageError:
    from ml_debug.core.visible import visible

    return UsageError(f"trace file {visible(path)}: {visible(what)}: not written, the program not run",
                      "another user may have planted it in a shared --out-dir: remove it, or give an --out-dir of "
                      "your own")


def _refuse_planted(path: str) -> None:
    """The stream's file name must be free or a regular file of ours with one name: never a link to
    follow (the file sink opens with O_NOFOLLOW and would fail inside the traced run, which then read as
    the program's own error), a FIFO or a hard link to another file."""
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise _planted(path, f"a symbolic link (to {os.readlink(path)})")
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1 or st.st_uid not in (os.geteuid(), os.getuid()):
        raise _planted(path, "not a regular file of ours with one name")


def run_traced(opts: TraceCommandOptions) -> TraceRun:
    """Run ``opts.target`` (script and its arguments, or module and its arguments) under NicerTrace.

    Shell equivalent: ``python -m trace --trace --timing --ignore-dir ... script.py``, with one
    file per process.
    """
    target, module, everything, ring, idle_dump = list(opts.target), opts.module, opts.everything, opts.ring, \
        opts.idle_dump
    include, dump_signals, out_dir = opts.include or None, opts.dump_signal or None, str(opts.out_dir)
    log_pids, line_format = opts.log_pids, opts.line_format.value
    if not target:
        raise UsageError("nothing to run", "mldebug trace [OPTIONS] -- script.py ARGS  or  mldebug trace -m module ARGS")
    packages: list[str] | str | None = None if everything else [p for item in include or [] for p in item.split(",") if p]
    if packages == []:
        packages = "uninstalled"
    signals = [parse_signal(s) for s in dump_signals] if dump_signals is not None else None
    try:
        tracer = NicerTrace(count=0, trace=1, timing=True, packages_to_include=packages, log_pids=log_pids,
                            out_dir=out_dir, ring=ring, idle_dump=idle_dump, line_format=line_format,
                            dump_signals="default" if signals is None else signals)
    except (TypeError, ValueError) as e:
        raise _usage_error(str(e)) from None

    from ml_debug.core import safefs

    safefs.make_out_dir(out_dir)  # no link of another user followed on the way; the directory ours or root's
    try:
        if not os.access(out_dir, os.W_OK):
            raise PermissionError(f"{out_dir} is not writable")
    except OSError as e:
        raise UsageError(f"cannot write trace files to {out_dir}: {e}", "give a writable --out-dir") from None
    if ring is None:  # a stream opens its file as the program starts (a ring renames its file into place)
        _refuse_planted(os.path.join(os.path.abspath(out_dir), trace_file_name()))

    name, args = target[0], target[1:]
    func: Callable[..., Any]
    if module:
        sys.path.insert(0, os.getcwd())  # before the look-up, as `python -m` finds modules here first
        _find_module(name)
        sys.argv = [name, *args]  # run_module(alter_sys=True) puts the module's file in argv[0]
        func, fargs, fkw = runpy.run_module, (name,), {"run_name": "__main__", "alter_sys": True}
    else:
        if not os.path.isfile(name):
            raise UsageError(f"no such script: {name}", "give a Python file, or -m MODULE for a module")
        sys.argv = [name, *args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(name)))
        # An absolute path, as `python script.py` gives __file__ (and trace lines the full path).
        func, fargs, fkw = runpy.run_path, (os.path.abspath(name),), {"run_name": "__main__"}

    skip = {os.path.realpath(f) for f in (__file__, runpy.__file__, sys.modules["trace"].__file__,
                                           sys.modules["ml_debug.nicertrace"].__file__) if f}
    code = 0
    try:
        tracer.runfunc(func, *fargs, **fkw)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            sys.stderr.write(f"{e.code}\n")
            code = 1
    except KeyboardInterrupt:
        code = 130
    except OSError as e:
        if tracer.path is None or e.filename != tracer.path:  # the traced program's own error
            _user_traceback(e, skip)
            code = 1
        else:  # planted after the check above: the trace file refused, the program never started
            raise _planted(tracer.path, e.strerror or str(e)) from None
    except BaseException as e:  # the traced program's own error: report it as python would
        _user_traceback(e, skip)
        code = 1
    finally:
        sys.stdout.flush()
    shown = " ".join((["-m"] if module else []) + [name])
    return TraceRun(ok=code == 0, summary=f"{shown} exited with code {code}", program=list(target), module=module,
                    exit_code=code, trace_file=tracer.path, out_dir=os.path.abspath(out_dir))
