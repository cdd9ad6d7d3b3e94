"""`mldebug trace` (run a program under NicerTrace) and `mldebug trace-tail` (who stopped where)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ml_debug.core.options import argument, option, parse_out_dir
from ml_debug.tracing.options import MAX_RING

if TYPE_CHECKING:
    from rich.console import Console

    from ml_debug.tracing.tail import TailReport

TAIL_SCHEMA = "mldebug.trace-tail"


TRACE_HELP = """Run a program and log every call and line of your code to one file per process.

When a rank stops responding and py-spy cannot attach, its trace file still says what it did
last. Read them together with `mldebug trace-tail DIR`.

Options of `mldebug trace` come first: everything after the script (or -m MODULE) goes to the
program.

Exit codes: the program's own exit code (128+N when a signal ended it); 2 bad options."""

TRACE_EXAMPLES = (
    "mldebug trace -- train.py --lr 1e-3",
    "mldebug trace --ring 10000 --idle-dump 60 -m mypkg.train --epochs 1",
    "torchrun --nproc-per-node 8 --no-python mldebug trace -o traces -- train.py",
)

TAIL_HELP = """The last lines of every trace file, grouped by identical endings: who stopped where.

Time stamps, pids and addresses are ignored when comparing.

Files that are not trace files (no `# nicertrace` header, or not named trace-HOST-RANK-PID.txt) are
skipped, with the reason.

Exit codes: 0 every file ends the same way; 1 they differ (the odd group is named); 2 no usable
trace file is found."""

TAIL_EXAMPLES = (
    "mldebug trace-tail traces/",
    "mldebug trace-tail -n 10 --grep 'all_reduce' traces/",
)


class LineFormat(str, enum.Enum):
    """How `mldebug trace` writes each call and line."""

    nicer = "nicer"
    seed = "seed"


@dataclass(frozen=True)
class TraceOptions:
    """The options of `mldebug trace`."""

    target: list[str] = argument(
        metavar="PROGRAM", help="The script and its arguments (or, with -m, the module and its arguments): "
                                "everything from here on goes to the program, so give mldebug trace's options "
                                "before it. Put -- before the script when its name starts with a dash.")
    module: bool = option(False, flags=("-m", "--module"), help="Run a module, like python -m.")
    include: list[str] = option(
        flags=("--include", "-i"), default_factory=list, metavar="PKG",
        help="Also trace this installed top-level package (repeat, or a,b). Your own code (anything outside "
             "site-packages and the standard library) is always traced.")
    everything: bool = option(False, help="Trace all code, the standard library and site-packages included "
                                          "(slow, big).")
    out_dir: Path = option(Path("."), flags=("--out-dir", "-o"), envvar="MLDEBUG_TRACE_DIR", parse=parse_out_dir,
                           help="Where trace-HOST-RANK-PID.txt files go (one per process and forked child).")
    ring: int | None = option(None, min=1, max=MAX_RING, metavar="N",
                              help="Keep only the last N events per thread in memory; write them at exit, on "
                                   "--dump-signal and after --idle-dump seconds of quiet.")
    idle_dump: float | None = option(None, metavar="SECONDS", min=0.01,
                                     help="With --ring: write the ring when no new event arrived for this long "
                                          "(a hang).")
    dump_signal: list[str] = option(default_factory=list, metavar="SIG",
                                    help="With --ring: signals that write the ring (default TERM and USR1). "
                                         "USR1/USR2 keep the program running; others then act as before (TERM "
                                         "still ends it).")
    log_pids: bool = option(False, help="Prefix every line with [pid N].")
    line_format: LineFormat = option(
        LineFormat.nicer, flags=("--format",),
        help="nicer: millisecond time stamps on every line, qualified function names, thread tags. seed: "
             "the line format of the ML Engineering handbook's NicerTrace, for tools that parse it.")


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


def trace_command(opts: TraceOptions) -> int:
    from ml_debug.core import output
    from ml_debug.core.errors import UsageError
    from ml_debug.tracing.run import run_traced

    if opts.idle_dump is not None and opts.ring is None:
        raise UsageError("--idle-dump needs --ring N", "e.g. --ring 10000 --idle-dump 30")
    if opts.dump_signal and opts.ring is None:
        raise UsageError("--dump-signal needs --ring N",
                         "without --ring every event is already on disk (flushed every 0.5 s)")
    result = run_traced(list(opts.target), module=opts.module, include=opts.include or None,
                        everything=opts.everything, out_dir=str(opts.out_dir), ring=opts.ring,
                        idle_dump=opts.idle_dump, dump_signals=opts.dump_signal or None, log_pids=opts.log_pids,
                        line_format=opts.line_format.value)
    if result.trace_file:
        output.log(f"mldebug trace: wrote {result.trace_file}")
    return result.exit_code


def tail_command(opts: TailOptions) -> int:
    from ml_debug.core import output
    from ml_debug.tracing.tail import tail_traces

    report = tail_traces(opts.paths or ["."], lines=opts.lines, grep=opts.grep, all_threads=opts.all_threads)
    output.emit(TAIL_SCHEMA, 1, report, lambda console: render_tail(console, report))
    return 0 if report.ok else 1


def render_tail(console: Console, r: TailReport) -> None:
    from rich.table import Table
    from rich.text import Text

    console.print(Text(r.summary, style="bold" if r.ok else "bold red"))
    for g in r.groups:
        members = [f for f in r.files if f.group == g.id]
        label = "odd one out" if g.odd else ("majority" if len(r.groups) > 1 else "all")
        console.print(Text(f"\ngroup {g.id} ({label}): {g.size} file{'s' if g.size != 1 else ''}: "
                           + ", ".join(f.who for f in members[:8])
                           + (f" (+{len(members) - 8} more)" if len(members) > 8 else ""),
                           style="bold yellow" if g.odd else "bold"))
        for line in g.ending or ["(no events)"]:
            console.print(Text(f"  {line}"), soft_wrap=True)
    t = Table(title="\nfiles", title_justify="left", show_edge=False, pad_edge=False)
    for col in ("group", "rank", "host", "pid", "mode", "last event", "silent for"):
        t.add_column(col)
    if r.grep is not None:
        t.add_column(f"grep {r.grep!r}", justify="right")
    t.add_column("file", overflow="fold")
    for f in r.files:
        row = [f.group, "na" if f.rank is None else str(f.rank), f.host or "?", str(f.pid or "?"),
               (f.mode or "?") + (f" ({f.dump_reason})" if f.dump_reason else ""),
               f"+{f.last_elapsed_s:.3f}s" if f.last_elapsed_s is not None else "-",
               f"{f.silent_for_s:.1f}s" if f.silent_for_s is not None else "-"]
        if r.grep is not None:
            row.append(str(f.grep_count))
        row.append(f.path)
        t.add_row(*row)
    console.print(t)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    # Stop option parsing at the script name: its own options belong to it (like python itself).
    command(app, "trace", trace_command, help=TRACE_HELP, examples=TRACE_EXAMPLES,
            context_settings={"allow_interspersed_args": False}, opts=TraceOptions)
    command(app, "trace-tail", tail_command, help=TAIL_HELP, examples=TAIL_EXAMPLES, opts=TailOptions)
