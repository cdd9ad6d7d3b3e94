"""`mldebug trace` (run a program under NicerTrace) and `mldebug trace-tail` (who stopped where)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import typer

from ml_debug.tracing.command_options import TailOptions, TraceCommandOptions

if TYPE_CHECKING:
    from rich.console import Console

    from ml_debug.tracing.tail import TailReport

TRACE_SCHEMA = "mldebug.trace"
TAIL_SCHEMA = "mldebug.trace-tail"


TRACE_HELP = """Run a program and log every call and line of your code to one file per process.

When a rank stops responding and py-spy cannot attach, its trace file still says what it did
last. Read them together with `mldebug trace-tail DIR`.

Options of `mldebug trace` come first: everything after the script (or -m MODULE) goes to the
program.

With --json, the program's own output goes to stderr and stdout carries one document: how the
program ended and its trace file.

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


def trace_command(opts: TraceCommandOptions) -> int:
    from ml_debug.core import output
    from ml_debug.tracing.run import run_traced

    opts.validate()
    parent = os.getpid()
    with _program_output_on_stderr(output.MODE.json):
        result = run_traced(opts)
    if result.trace_file:
        output.log(f"mldebug trace: wrote {result.trace_file}")
    if os.getpid() != parent:  # a child the program forked, returning through here: its parent reports the run
        output.configure(json=False)
        return result.exit_code
    output.emit(TRACE_SCHEMA, 1, result)
    return result.exit_code


@contextmanager
def _program_output_on_stderr(json: bool) -> Iterator[None]:
    """With --json, stdout carries one document: what the program (and every process it starts) writes to
    stdout goes to stderr meanwhile, at the descriptor, so a C extension's or a child's output moves too."""
    if not json:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        try:
            sys.stdout.flush()  # the program's last lines, to stderr where the rest went
        except (OSError, ValueError):  # the program closed or broke its sys.stdout: nothing of it is left
            pass
        os.dup2(saved, 1)
        os.close(saved)


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
            context_settings={"allow_interspersed_args": False}, opts=TraceCommandOptions)
    command(app, "trace-tail", tail_command, help=TAIL_HELP, examples=TAIL_EXAMPLES, opts=TailOptions)
