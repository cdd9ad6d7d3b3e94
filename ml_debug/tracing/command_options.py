"""The options of `mldebug trace` and `mldebug trace-tail` (cheap to import: the CLI builds its options
from them). Not imported by :mod:`ml_debug.nicertrace`: user code never needs them."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from ml_debug.core.errors import UsageError
from ml_debug.core.options import argument, option, parse_out_dir
from ml_debug.tracing.options import MAX_RING, needs_ring


class LineFormatName(str, enum.Enum):
    """How `mldebug trace` writes each call and line."""

    nicer = "nicer"
    seed = "seed"


@dataclass(frozen=True)
class TraceCommandOptions:
    """The options of `mldebug trace` (the tracer's own settings are :class:`ml_debug.tracing.options.TraceOptions`)."""

    target: list[str] = argument(
        metavar="PROGRAM", empty=True, help="The script and its arguments (or, with -m, the module and its arguments): "
                                "everything from here on goes to the program, so give mldebug trace's options "
                                "before it. Put -- before the script when its name starts with a dash.")
    module: bool = option(False, flags=("-m", "--module"), help="Run a module, like python -m.")
    include: list[str] = option(
        flags=("--include",), renamed_from=("-i",), default_factory=list, metavar="PKG",
        help="Also trace this installed top-level package (repeat, or a,b). Your own code (anything outside "
             "site-packages and the standard library) is always traced.")
    everything: bool = option(False, help="Trace all code, the standard library and site-packages included "
                                          "(slow, big).")
    out_dir: Path = option(Path("."), flags=("--out-dir", "-o"), metavar="DIR", envvar="MLDEBUG_TRACE_DIR",
                           parse=parse_out_dir,
                           help="Write the trace files here as the program runs: trace-HOST-RANK-PID.txt, "
                                "one per process and forked child.")
    ring: int | None = option(None, min=1, max=MAX_RING, metavar="N",
                              help="Keep only the last N events per thread in memory; write them at exit, on "
                                   "--dump-signal and after --idle-dump seconds of quiet.")
    idle_dump: float | None = option(None, metavar="S", min=0.01,
                                     help="With --ring: write the ring when no new event arrived for this long "
                                          "(a hang).")
    dump_signal: list[str] = option(default_factory=list, metavar="SIG",
                                    help="With --ring: signals that write the ring (default TERM and USR1). "
                                         "USR1/USR2 keep the program running; others then act as before (TERM "
                                         "still ends it).")
    log_pids: bool = option(False, help="Prefix every line with [pid N].")
    line_format: LineFormatName = option(
        LineFormatName.nicer, flags=("--format",),
        help="nicer: millisecond time stamps on every line, qualified function names, thread tags. seed: "
             "the line format of the ML Engineering handbook's NicerTrace, for tools that parse it.")


    def validate(self) -> None:
        """Raise UsageError (exit 2) for settings that contradict each other, before the program starts."""
        if needs_ring(self.ring, self.idle_dump):
            raise UsageError("--idle-dump needs --ring N", "e.g. --ring 10000 --idle-dump 30")
        if self.dump_signal and self.ring is None:
            raise UsageError("--dump-signal needs --ring N",
                             "without --ring every event is already on disk (flushed every 0.5 s)")

@dataclass(frozen=True)
class TailOptions:
    """The options of `mldebug trace-tail`."""

    paths: list[str] = argument(default_factory=list, metavar="PATH",
                                help="Trace files, or directories searched for trace-*.txt (default: the current "
                                     "directory).")
    lines: int = option(5, flags=("-n", "--lines"), min=1, help="How many last lines to compare.")
    grep: str | None = option(None, metavar="PATTERN",
                              help="Also count the lines matching this regular expression in each file.")
    all_threads: bool = option(False, help="Compare the last lines of every thread, not only the main thread's.")
