"""The logs views: the ranks' timeline per node (the first failure, the failures that followed it), the
timeline table, identical tracebacks and the sources read. Drawn from ``logs.result.LogsReport``."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import TYPE_CHECKING

from ml_debug.logs.result import TIME_BOUNDS
from ml_debug.page.shell import Section
from ml_debug.page.text import esc

if TYPE_CHECKING:
    from ml_debug.logs.result import Event, LogsReport

MAX_LANES = 300  # nodes drawn as lanes; the rest are counted
MAX_MARKS = 60  # events drawn per lane
MAX_ROWS = 500
RANK_LANES = 64  # up to this many ranks, a lane each


def _clock(t: float | None) -> str:
    if t is None:
        return ""
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1000):03d}"


def _is_primary(e: Event, report: LogsReport) -> bool:
    p = report.verdict.primary
    return p is not None and e.source_index == p.source_index and e.offset == p.offset


def _mark(e: Event, report: LogsReport) -> str:
    """The mark's class: the first failure, another cause, an exit or kill (evidence only), a consequence..."""
    if _is_primary(e, report):
        return "first"
    if e.cls == "primary":
        return "cause" if e.strong else "exit"
    return e.cls


def lanes_html(report: LogsReport) -> str:
    """One lane per node; each failure a mark at its time (or, without times, at its place in the files)."""
    events = [e for e in report.events if e.cls != "info"]
    if not events:
        return '<p class="dim">no failure or warning in the logs</p>'
    if all(e.time is not None for e in events):
        t0 = min(e.time for e in events if e.time is not None)
        t1 = max(e.time for e in events if e.time is not None)
        pos = {id(e): ((e.time or t0) - t0) / ((t1 - t0) or 1.0) for e in events}
        axis = f"{_clock(t0)} … {_clock(t1)} ({t1 - t0:.1f} s)"
    else:  # some without a time: in the verdict's order (the first failure first), evenly spaced
        far = float("inf")
        ordered = sorted(events, key=lambda e: (not _is_primary(e, report), e.time if e.time is not None else far,
                                                e.order_key()))
        pos = {id(e): i / max(1, len(ordered) - 1) for i, e in enumerate(ordered)}
        axis = "in order (not every line has a time stamp): the first failure first, then the others as found"
    # a lane per rank where they are few (grouped by node), else a lane per node
    per_rank = len({(e.who.node, e.who.rank) for e in events}) <= RANK_LANES
    lanes: dict[tuple[str, int | None], list[Event]] = defaultdict(list)
    for e in events:
        lanes[(e.who.node or "unknown node", e.who.rank if per_rank else None)].append(e)
    p = report.verdict.primary
    first = (p.who.node or "unknown node", p.who.rank if per_rank else None) if p is not None else None
    names = sorted(lanes, key=lambda k: (k[0] != (first or ("",))[0], k != first, k[0],
                                         -1 if k[1] is None else k[1]))
    rows = []
    from ml_debug.core.ranges import compress

    for key in names[:MAX_LANES]:
        marks = []
        evs = sorted(lanes[key], key=lambda e: (not _is_primary(e, report), pos[id(e)]))
        spec = compress(e.who.rank for e in evs if e.who.rank is not None)
        for e in evs[:MAX_MARKS]:
            cls = _mark(e, report)
            tip = f"{e.who.label()}: {e.message} ({_clock(e.time) or e.time_source})"
            marks.append(f'<span class="mark {esc(cls)}" style="left:{pos[id(e)] * 100:.2f}%" title="{esc(tip)}">'
                         "</span>")
        rows.append(f'<tr class="{"outlier" if key == first else ""}"><td>{esc(key[0])}</td>'
                    f'<td><span data-ranks="{esc(spec)}">{esc(spec or "?")}</span></td>'
                    f'<td class="wide"><div class="lane">{"".join(marks)}</div></td></tr>')
    if report.verdict.silent_ranks:
        spec = report.verdict.silent_ranks
        rows.append(f'<tr class="warn"><td>silent</td><td><span data-ranks="{esc(spec)}">{esc(spec)}</span></td>'
                    '<td>no failure in the logs: hung, or killed without a trace?</td></tr>')
    more = len(names) - min(len(names), MAX_LANES)
    legend = ('<p class="legend"><span><i class="first"></i>first failure</span>'
              '<span><i class="cause"></i>another cause</span>'
              '<span><i class="secondary"></i>secondary (a consequence of a peer)</span>'
              '<span><i class="exit"></i>exit or kill</span><span><i class="warning"></i>warning</span>'
              f'<span class="dim">time: {esc(axis)}</span></p>')
    return (legend + f'<table><thead><tr><th>node</th><th>ranks</th><th>failures in time</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>' + (f'<p class="dim">and {more} more node(s)</p>' if more else ""))


def timeline_html(report: LogsReport) -> str:
    rows = []
    for r in report.timeline[:MAX_ROWS]:
        cls = "outlier" if r.cls == "primary" else "warn" if r.cls == "secondary" else ""
        when = _clock(r.time) + (f" … {_clock(r.last_time)}" if r.last_time and r.last_time != r.time else "")
        if when and r.time_source in TIME_BOUNDS:
            when = TIME_BOUNDS[r.time_source][0] + when
        rows.append(f'<tr class="{cls}"><td class="mono">{esc(when or r.time_source)}</td><td>{esc(r.cls)}</td>'
                    f'<td><span data-ranks="{esc(r.ranks)}">{esc(r.who)}</span> <span class="count">({r.count})</span>'
                    f"</td><td>{esc(r.message)}</td></tr>")
    more = len(report.timeline) - len(rows)
    bounds = sorted({r.time_source for r in report.timeline[:MAX_ROWS] if r.time is not None} & set(TIME_BOUNDS))
    return ("<table><thead><tr><th>time</th><th>class</th><th>who</th><th>what</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>" + (f'<p class="dim">and {more} more rows</p>' if more else "")
            + "".join(f'<p class="dim">{esc(" ".join(TIME_BOUNDS[b]))}</p>' for b in bounds))


def tracebacks_html(report: LogsReport) -> str:
    out = []
    for t in report.tracebacks[:50]:
        out.append(f'<details{" open" if t.cls == "primary" else ""}><summary><span data-ranks="{esc(t.ranks)}" '
                   f'class="ranks">[{esc(t.ranks or ", ".join(t.who[:3]))}]</span> <span class="count">({t.count})'
                   f"</span> {esc(t.message)}</summary><pre>{esc(chr(10).join(t.text[-60:]), keep=chr(9))}</pre>"
                   "</details>")
    return "".join(out) or '<p class="dim">no traceback</p>'


def sources_html(report: LogsReport) -> str:
    rows = []
    for s in report.sources[:MAX_ROWS]:
        rows.append(f'<tr class="{"warn" if s.error else ""}"><td class="mono">{esc(s.path)}</td><td>{esc(s.shape)}'
                    f"</td><td>{esc(s.who.label())}</td><td>{s.lines}</td><td>{s.events}</td>"
                    f"<td>{esc(s.error or s.note or '')}</td></tr>")
    for sk in report.skipped[:MAX_ROWS]:
        rows.append(f'<tr class="warn"><td class="mono">{esc(sk.get("path", ""))}</td><td colspan="4">not read</td>'
                    f'<td>{esc(sk.get("reason", ""))}</td></tr>')
    return ("<table><thead><tr><th>source</th><th>shape</th><th>writer</th><th>lines</th><th>events</th>"
            f"<th>note</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def verdict_html(report: LogsReport) -> str:
    v = report.verdict
    parts = []
    if v.primary is not None:
        p = v.primary
        parts.append(f"<p><b>first failure:</b> {esc(p.who.label())}: {esc(p.message)} "
                     f'<span class="dim">({esc(p.source)}:{p.line}; {esc(v.basis or "")})</span></p>')
    if v.secondary:
        items = "".join(f"<li>{esc(s.get('label'))} ×{esc(s.get('count'))} on ranks {esc(s.get('ranks'))}</li>"
                        for s in v.secondary[:20])
        parts.append(f"<p><b>then, as a consequence:</b></p><ul>{items}</ul>")
    for e in v.independent[:10]:
        parts.append(f"<p><b>another cause:</b> {esc(e.who.label())}: {esc(e.message)}</p>")
    for label, value in (("silent ranks", v.silent_ranks), ("blamed ranks", v.blamed_ranks), ("peers lost", v.peers_lost), ("same second", v.tie),
                         ("next step", v.hint)):
        if value:
            parts.append(f"<p><b>{esc(label)}:</b> {esc(value)}</p>")
    parts.append(f'<p class="dim">confidence: {esc(v.confidence)} {esc(v.confidence_why)}</p>')
    if v.findings:
        parts.append("<ul>" + "".join(f"<li>{esc(f)}</li>" for f in v.findings[:20]) + "</ul>")
    return "".join(parts)


def sections(report: LogsReport) -> list[Section]:
    return [Section("answer", "the answer", verdict_html(report)),
            Section("timeline", "the ranks' timeline, per node", lanes_html(report),
                    note=f"{len(report.nodes)} node(s), ranks {report.ranks_seen or '?'}"),
            Section("timeline-table", "timeline", timeline_html(report), open=False, note=str(len(report.timeline))),
            Section("tracebacks", "identical tracebacks", tracebacks_html(report), open=False,
                    note=str(len(report.tracebacks))),
            Section("sources", "what was read", sources_html(report), open=False, note=str(len(report.sources)))]
