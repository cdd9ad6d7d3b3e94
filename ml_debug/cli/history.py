"""`mldebug history`: each node's history (checks, drains and resumes, failed jobs) from SQLite."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from ml_debug.history.options import HistoryOptions

if TYPE_CHECKING:
    from rich.console import Console

    from ml_debug.history.queries import HistoryResult
    from ml_debug.logs.result import LogsReport

SCHEMA = "mldebug.history"

HELP = """Each node's history, from the SQLite database that `mldebug health --slurm-check` (every
check, drain and resume) and, with MLDEBUG_HISTORY set, `mldebug logs` (each failed job's nodes)
write: which nodes fail what now and since when, which nodes recur in failed jobs, and one node's
timeline with --node.

Exit codes: 0 no node fails a check now; 1 some node does; 2 bad input (no database there, an
unknown --node, a file that is not a history database); 3 written by a newer mldebug."""

EXAMPLES = (
    "mldebug history                                   # what fails now, which nodes recur in failed jobs",
    "mldebug history --node node17                     # that node's timeline",
    "mldebug history --since 7d --history /shared/mldebug/history.db --json",
)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "history", history, help=HELP, examples=EXAMPLES, opts=HistoryOptions)


def history(opts: HistoryOptions) -> int:
    from ml_debug.core import output
    from ml_debug.core.errors import UsageError
    from ml_debug.history import queries
    from ml_debug.history.store import open_history

    with open_history(opts.history, read_only=True) as h:
        if opts.node is not None and opts.node not in queries.known_nodes(h):
            raise UsageError(f"the history at {h.path} names no node {opts.node!r}",
                             "`mldebug history` lists the nodes it knows; node names are Slurm's (`sinfo -N`)")
        failing = queries.failing(h, opts.since, opts.node)
        recurring = [] if opts.node else queries.recurring(h, opts.jobs, opts.since)
        timeline = queries.timeline(h, opts.node, opts.since) if opts.node else []
        counts = queries.counts(h)
        version = h.version
        path = str(h.path)
    nodes = sorted({f.node for f in failing})
    if failing:
        summary = f"{len(failing)} failing check(s) on {len(nodes)} node(s): {', '.join(nodes[:8])}" + \
            (" ..." if len(nodes) > 8 else "")
    else:
        summary = "no node fails a check now" if opts.node is None else f"{opts.node} fails no check now"
    result = queries.HistoryResult(not failing, summary, path, version, opts.since, counts, failing, recurring,
                                   opts.node, timeline)
    output.emit(SCHEMA, 1, result, lambda console: _draw(console, result))
    return 0 if result.ok else 1


def record_logs_incident(report: LogsReport, paths: list[str]) -> None:
    """A failed job's nodes into the node history (only where MLDEBUG_HISTORY names one); the job is
    named by the logs read, so reading the same logs again replaces, never doubles, its rows."""
    import os

    from ml_debug.core import output
    from ml_debug.history.store import record_incident

    v = report.verdict
    first = v.primary.who.node if v.primary is not None else None
    nodes = [*report.nodes, *([first] if first else [])]
    job = ",".join(sorted(p if p == "-" else os.path.realpath(p) for p in paths))
    note = record_incident("logs", job, nodes, first, v.summary)
    if note:
        output.warn(f"logs: {note}")


def _when(ts: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _draw(console: Console, r: HistoryResult) -> None:
    from rich.table import Table

    if r.failing:
        t = Table(title="failing now", title_justify="left")
        for col in ("node", "check", "since", "runs", "value"):
            t.add_column(col, overflow="fold")
        for f in r.failing:
            label = f.check if f.target in ("host", "node") else f"{f.target} {f.check.split('.', 1)[-1]}"
            t.add_row(f.node, label, _when(f.since), str(f.runs), f.value)
        console.print(t)
    if r.recurring:
        console.print("recurring in failed jobs:", markup=False)
        for rec in r.recurring:
            console.print(f"  {rec.line}", markup=False, highlight=False)
    if r.node is not None:
        t = Table(title=f"{r.node} timeline", title_justify="left")
        for col in ("time", "event", "what"):
            t.add_column(col, overflow="fold")
        for e in r.timeline:
            t.add_row(_when(e.ts), e.kind, e.what)
        console.print(t)
    c = r.counts
    console.print(f"{r.summary} ({c['runs']} runs, {c['checks']} check results, {c['actions']} drains/resumes, "
                  f"{c['incidents']} job incidents in {r.path})", markup=False, highlight=False)
