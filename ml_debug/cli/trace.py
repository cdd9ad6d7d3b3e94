"""`mldebug trace` (run a program under NicerTrace) and `mldebug trace-tail` (who stopped where)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ml_debug.cli.options import Json, use_json

if TYPE_CHECKING:
    from rich.console import Console

    from ml_debug.tracing.tail import TailReport

TAIL_SCHEMA = "mldebug.trace-tail"


def trace_command(
    target: Annotated[list[str], typer.Argument(
        metavar="PROGRAM", help="The script and its arguments (or, with -m, the module and its arguments). Put -- before "
             "them when an argument starts with a dash.", show_default=False)],
    module: Annotated[bool, typer.Option("-m", "--module", help="Run a module, like python -m.")] = False,
    include: Annotated[list[str] | None, typer.Option(
        "--include", "-i", metavar="PKG",
        help="Also trace this installed top-level package (repeat, or a,b). Your own code (anything "
             "outside site-packages and the standard library) is always traced.")] = None,
    everything: Annotated[bool, typer.Option(
        "--everything", help="Trace all code, the standard library and site-packages included (slow, big).")] = False,
    out_dir: Annotated[Path, typer.Option(
        "--out-dir", "-o", envvar="MLDEBUG_TRACE_DIR", file_okay=False,
        help="Where trace-HOST-RANK-PID.txt files go (one per process and forked child).")] = Path("."),
    ring: Annotated[int | None, typer.Option(
        "--ring", min=1, metavar="N",
        help="Keep only the last N events per thread in memory; write them at exit, on --dump-signal "
             "and after --idle-dump seconds of quiet.")] = None,
    idle_dump: Annotated[float | None, typer.Option(
        "--idle-dump", metavar="SECONDS", min=0.01,
        help="With --ring: write the ring when no new event arrived for this long (a hang).")] = None,
    dump_signal: Annotated[list[str] | None, typer.Option(
        "--dump-signal", metavar="SIG",
        help="With --ring: signals that write the ring (default TERM and USR1). USR1/USR2 keep the "
             "program running; others then act as before (TERM still ends it).")] = None,
    log_pids: Annotated[bool, typer.Option("--log-pids", help="Prefix every line with [pid N].")] = False,
) -> None:
    """Run a program and log every call and line of your code to one file per process.

    When a rank stops responding and py-spy cannot attach, its trace file still says what it did
    last. Read them together with `mldebug trace-tail DIR`.
    """
    from ml_debug.core import output
    from ml_debug.core.errors import UsageError
    from ml_debug.tracing.run import run_traced

    if idle_dump is not None and ring is None:
        raise UsageError("--idle-dump needs --ring N", "e.g. --ring 10000 --idle-dump 30")
    if dump_signal and ring is None:
        raise UsageError("--dump-signal needs --ring N",
                         "without --ring every event is already on disk (flushed every 0.5 s)")
    result = run_traced(list(target), module=module, include=include, everything=everything,
                        out_dir=str(out_dir), ring=ring, idle_dump=idle_dump, dump_signals=dump_signal,
                        log_pids=log_pids)
    if result.trace_file:
        output.log(f"mldebug trace: wrote {result.trace_file}")
    if result.exit_code != 0:
        raise typer.Exit(result.exit_code)


def tail_command(
    paths: Annotated[list[str] | None, typer.Argument(
        metavar="PATH", help="Trace files, or directories searched for trace-*.txt "
                                      "(default: the current directory).", show_default=False)] = None,
    lines: Annotated[int, typer.Option("-n", "--lines", min=1, help="How many last lines to compare.")] = 5,
    grep: Annotated[str | None, typer.Option(
        "--grep", metavar="PATTERN", help="Also count the lines matching this regular expression in each file.")] = None,
    all_threads: Annotated[bool, typer.Option(
        "--all-threads", help="Compare the last lines of every thread, not only the main thread's.")] = False,
    json: Json = False,
) -> None:
    """The last lines of every trace file, grouped by identical endings: who stopped where.

    Time stamps, pids and addresses are ignored when comparing. Exit 0 when every file ends the
    same way, 1 when they differ (the odd group is named), 2 when no trace file is found.
    """
    use_json(json)
    from ml_debug.core import output
    from ml_debug.tracing.tail import tail_traces

    report = tail_traces(paths or ["."], lines=lines, grep=grep, all_threads=all_threads)
    output.emit(TAIL_SCHEMA, 1, report, lambda console: render_tail(console, report))
    if not report.ok:
        raise typer.Exit(1)


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
    # Stop option parsing at the script name: its own options belong to it (like python itself).
    app.command("trace", context_settings={"allow_interspersed_args": False})(trace_command)
    app.command("trace-tail")(tail_command)
