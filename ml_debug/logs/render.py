"""The human view of a log triage: the verdict first, then the tracebacks with their rank sets, the
timeline, what NCCL said, and what was read."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from ml_debug.core.ranges import ranks as ranks_text
from ml_debug.core.visible import visible
from ml_debug.logs.labels import brief, clock
from ml_debug.logs.result import PRIMARY, SECONDARY, TIME_BOUNDS, LogsReport, TracebackGroup

if TYPE_CHECKING:
    from rich.console import Console

FRAMES_KEPT = 4  # frames at the end of a traceback shown unless --full
MAX_ROWS = 25


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _say(console: Console, text: str, style: str = "") -> None:
    """One line of the view (or a few, wrapped by the terminal: a message is never cut here)."""
    from rich.text import Text

    console.print(Text(text, style=style), soft_wrap=True)


def _traceback_lines(g: TracebackGroup, full: bool) -> list[str]:
    """The traceback as printed, the frames shortened to the last few unless ``full``."""
    lines = [ln for ln in g.text if ln.strip() and set(ln.strip()) - {"^", "~"}]
    frames = [i for i, ln in enumerate(lines) if ln.lstrip().startswith('File "')]
    if full or len(frames) <= FRAMES_KEPT:
        return lines
    return [*lines[:frames[0]], f"  … {len(frames) - FRAMES_KEPT} more frame(s) (--full shows them) …",
            *lines[frames[-FRAMES_KEPT]:]]


def render(r: LogsReport, console: Console, *, full: bool = False, tracebacks: int = 3) -> None:
    from rich.table import Table
    from rich.text import Text

    v = r.verdict
    style = {"failure": "bold red", "secondary-only": "bold yellow", "interrupted": "bold yellow",
             "suspect": "bold yellow"}.get(v.status, "bold green")
    _say(console, visible(v.summary), style)
    p = v.primary
    got = p.detail if p is not None else {}
    how = [f"chosen by {v.basis}", f"seen in {visible(p.source)}:{p.line}"] if p is not None else (
        [f"order: {v.basis}"] if v.basis else [])
    how += [text for said, text in ((got.get("raised_in"), f"raised in {got.get('raised_in')}"),
                                    (got.get("rank_from"), f"rank taken from the {got.get('rank_from')}"),
                                    (got.get("rank_by"), f"rank named by {got.get('rank_by')}"),
                                    (got.get("torchrun_root_cause") is False and got.get("via"),
                                     "torchrun's own 'Root Cause' names another rank")) if said]
    notes = (  # (shown?, the line, its style)
        (v.failed, f"  how sure: {v.confidence} ({v.confidence_why})", "dim"),
        (how, "  " + "; ".join(how), "dim"),
        (v.status == "failure" and v.silent_ranks, f"  ranks with no failure in the logs: {v.silent_ranks}",
         "dim"),
        (v.blamed_ranks, f"  peers name rank(s) {v.blamed_ranks} as missing", "yellow"),
        (v.hint, f"  next step: {v.hint}", ""),
        (got.get("note"), f"  note: {got.get('note')}", "dim"),
        *((True, f"  ! {f}", "yellow") for f in v.findings),
        *((src.repairs, f"  repaired {visible(src.path)}: {'; '.join(src.repairs)}", "yellow")
          for src in r.sources))
    for said, text, look in notes:
        if said:
            _say(console, text, look)

    groups = r.tracebacks if full else r.tracebacks[:tracebacks]
    if groups:
        console.print(Text(f"\ntracebacks ({len(r.tracebacks)} distinct):", style="bold"))
        for g in groups:
            ranks = ranks_text(g.ranks) if g.ranks else ", ".join(g.who) or "unknown rank"
            cls = "primary" if g.cls == PRIMARY else "secondary"
            _say(console, f"  {ranks} ({g.count} x, {cls}): {g.message if full else brief(g.message)}",
                 "bold red" if g.cls == PRIMARY else "yellow")
            for line in _traceback_lines(g, full):
                _say(console, f"    {line}")
        if len(r.tracebacks) > len(groups):
            console.print(Text(f"  … {len(r.tracebacks) - len(groups)} more (--full or --json)", style="dim"))

    rows = r.timeline if full else r.timeline[:MAX_ROWS]
    if rows:
        t = Table(title="\ntimeline", title_justify="left", show_edge=False, pad_edge=False)
        for col in ("time", "ranks", "", "what", "n"):
            t.add_column(col, overflow="fold")
        for row in rows:
            when = clock(row.time) if row.time is not None else "-"
            if row.last_time is not None and row.time is not None and clock(row.last_time) != when:
                when += f"-{clock(row.last_time)}"
            if row.time is not None and row.time_source in TIME_BOUNDS:
                when = TIME_BOUNDS[row.time_source][0] + when
            mark = {PRIMARY: "primary", SECONDARY: "after"}.get(row.cls, row.cls)
            t.add_row(when, row.ranks or row.who or "?", mark, brief(row.message) if row.count == 1 else row.label,
                      str(row.count), style="red" if row.cls == PRIMARY else None)
        console.print(t)
        bounds = sorted({row.time_source for row in rows if row.time is not None} & set(TIME_BOUNDS))
        if bounds:
            console.print(Text("  " + "; ".join(" ".join(TIME_BOUNDS[b]) for b in bounds), style="dim"))
        if len(r.timeline) > len(rows):
            console.print(Text(f"  … {len(r.timeline) - len(rows)} more rows (--full or --json)", style="dim"))

    if r.nccl:
        _render_nccl(r, console)
    _render_progress(r, console)

    shapes = Counter(s.shape for s in r.sources)
    total = sum(s.bytes for s in r.sources)
    lines = sum(s.lines for s in r.sources)
    launchers = f"; written by {', '.join(r.launchers)}" if r.launchers else ""
    _say(console, f"\nread {len(r.sources)} source(s), {_size(total)}, {lines:,} lines ("
         + ", ".join(f"{n} {k}" for k, n in sorted(shapes.items())) + f"); ranks seen {r.ranks_seen or '-'}"
         + (f" of {r.world_size}" if r.world_size else "")
         + (f" on {len(r.nodes)} node(s)" if r.nodes else "") + launchers, "dim")
    if len(r.sources) > 1:  # several files: each one's view of the job (one agent's node, one rank ...)
        for s in r.sources[:MAX_ROWS]:
            if s.view or s.launchers:
                _say(console, f"  {visible(s.path)}: {s.view or 'unknown writers'}"
                     + (f" ({', '.join(s.launchers)})" if s.launchers else ""), "dim")
    for skip in r.skipped[:10]:
        _say(console, f"  not read: {visible(skip['path'])}: {visible(skip['reason'])}", "yellow")
    if len(r.skipped) > 10:
        console.print(Text(f"  … {len(r.skipped) - 10} more not read (--json lists them)", style="yellow"))
    if r.dropped_events:
        console.print(Text(f"  {r.dropped_events} repeated event(s) not kept (bounded memory)", style="dim"))


def _render_nccl(r: LogsReport, console: Console) -> None:
    n = r.nccl
    assert n is not None
    versions = ", ".join(n["versions"]) or "version not printed"
    world = f", {n['world_size']} ranks" if n.get("world_size") else ""
    nodes = f" on {n['nodes']} node(s)" if n.get("nodes") else ""
    nets = sorted({x for h in n["hosts"] for x in h["network"]})
    _say(console, f"\nNCCL {versions}{world}{nodes}" + (f", network {', '.join(nets)}" if nets else "")
         + f" ({n['lines']:,} NCCL_DEBUG lines)", "bold")
    if n["transports"]:
        console.print("  transports: " + "; ".join(f"{t['transport']} {t['pairs']} pair(s) (e.g. {t['example']})"
                                                   for t in n["transports"]), soft_wrap=True)
    if n["ring_count"]:
        console.print(f"  rings: {n['ring_count']} channel(s), e.g. {n['rings'][0]['order'][:120]}",
                      soft_wrap=True)
    if n["trees"]["ranks"]:
        per = ", ".join(f"{k} tree(s) on {v} rank(s)" for k, v in n["trees"]["per_rank"].items())
        console.print(f"  trees: {per}", soft_wrap=True)
    if n["environment"]:
        console.print("  set: " + ", ".join(f"{k}={'/'.join(v)}" for k, v in n["environment"].items()), soft_wrap=True)
    for f in n["findings"]:
        warning = f["severity"] == "warning"
        _say(console, f"  {'!' if warning else '-'} {f['text']}", "yellow" if warning else "")
    for w in n["warnings"][:5]:
        where = ranks_text(w["ranks"]) if w["ranks"] else ", ".join(w["hosts"][:3])
        _say(console, f"  WARN x{w['count']} ({where}): {w['text']}", "yellow")


def _render_progress(r: LogsReport, console: Console) -> None:
    for key, said in (("train", "mldebug train metrics: {ranks} reached step {max_step}"),
                      ("nccl_work", "NCCL watchdog: last completed collective {max_completed} on {ranks}")):
        got = r.progress.get(key)
        if got:
            behind = f"; behind: {ranks_text(got['behind'])}" if got["behind"] else ""
            _say(console, "\n" + said.format(**{**got, "ranks": ranks_text(got["ranks"])}) + behind)
