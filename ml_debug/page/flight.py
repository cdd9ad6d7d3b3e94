"""The Flight Recorder view: per process group, ranks x collective sequence numbers (completed,
enqueued but not completed, never issued), where each rank stopped, and the desync.

Drawn from the ``flight_recorder`` section of a dump-stacks result (``stacks.flight.section``). Ranks
that stopped at the same place share one row, so 16k ranks make as many rows as there are places."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ml_debug.page.shell import Section
from ml_debug.page.text import esc

COLUMNS = 24  # sequence numbers drawn per group: the last ones, where ranks part ways
MAX_ROWS = 200
MAX_GROUPS = 32  # process groups drawn


def _who(rec: dict[str, Any]) -> int | None:
    rank = rec.get("rank")
    return rank if isinstance(rank, int) else None


def _op(c: dict[str, Any] | None) -> str:
    return str((c or {}).get("op") or "")


def group_rows(records: list[dict[str, Any]], desync: dict[str, tuple[int, set[int]]] | None = None
               ) -> dict[str, list[dict[str, Any]]]:
    """Per process group id: rows of ranks that stopped at the same place (last completed, last enqueued)."""
    from ml_debug.core.ranges import compress

    desync = desync or {}
    by_pg: dict[str, dict[tuple[int, int, str, bool], list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for rec in records:
        for pg in rec.get("process_groups") or []:
            done = pg.get("last_completed_seq") or 0
            queued = pg.get("last_enqueued_seq") or 0
            # the collective enqueued last, and being a desync's odd rank, part ranks at the same numbers
            pg_id = str(pg.get("pg_id"))
            odd = _who(rec) in desync.get(pg_id, (0, set()))[1]
            by_pg[pg_id][(int(done), int(queued), _op(pg.get("last_enqueued")), odd)].append({"rec": rec, "pg": pg})
    out: dict[str, list[dict[str, Any]]] = {}
    for pg_id, places in by_pg.items():
        rows = []
        for (done, queued, _, odd), members in places.items():
            ranks = [r for r in (_who(m["rec"]) for m in members) if r is not None]
            first = members[0]["pg"]
            rows.append({"done": done, "queued": queued, "size": len(members), "ranks": compress(ranks), "odd": odd,
                         "hosts": sorted({str(m["rec"].get("host") or "") for m in members}),
                         "completed_op": _op(first.get("last_completed")),
                         "enqueued_op": _op(first.get("last_enqueued"))})
        rows.sort(key=lambda r: (r["queued"], r["done"]))  # the ones that stopped first on top
        out[pg_id] = rows
    return out


def _desyncs(analysis: dict[str, Any] | None) -> dict[str, tuple[int, set[int]]]:
    """Per process group: the collective number where ranks issued different collectives, and the odd ranks."""
    out = {}
    for g in (analysis or {}).get("process_groups") or []:
        m = g.get("mismatch")
        if m and m.get("seq") is not None:
            odd = {r for side in m.get("sides") or [] if side.get("odd") for r in side.get("ranks") or []}
            out[str(g.get("pg"))] = (int(m["seq"]), odd)
    return out


def grid_html(pg_id: str, rows: list[dict[str, Any]], desync: tuple[int, set[int]] | None,
              behind: set[int] | None = None) -> str:
    """One process group's grid; `behind`: the ranks ``stacks.flight.behind_ranks`` found behind in it."""
    from ml_debug.core.ranges import expand


    top = max(r["queued"] for r in rows)
    lo = max(1, min(top - 7, max(top - COLUMNS + 1, min(r["done"] for r in rows) - 2)))  # 8 to 24 columns
    seqs: list[int | None] = list(range(lo, top + 1))
    if desync is not None and desync[0] < lo:  # the desync, further back: its own column before a gap
        seqs = [desync[0], None, *seqs]
    head = "".join(f'<th class="mono" title="#{s}">{s % 100:02d}</th>' if s is not None else "<th>…</th>"
                   for s in seqs)
    body = []
    for r in rows[:MAX_ROWS]:
        cells = []
        odd_seq = desync[0] if desync is not None and r["odd"] else None
        for s in seqs:
            if s is None:
                cells.append('<td class="c"></td>')
                continue
            cls = "done" if s <= r["done"] else "pend" if s <= r["queued"] else "none"
            if s == odd_seq:
                cls = "desync"
            cells.append(f'<td class="c {cls}" title="#{s}: {cls}"></td>')
        late = behind is not None and not behind.isdisjoint(expand(r["ranks"]))
        odd = odd_seq is not None or late
        stopped = (f"completed #{r['done']} {esc(r['completed_op'])}; enqueued #{r['queued']} "
                   f"{esc(r['enqueued_op'])}")
        body.append(f'<tr class="{"outlier" if odd else ""}"><td class="who"><span data-ranks="{esc(r["ranks"])}">'
                    f'{esc(r["ranks"] or "?")}</span> <span class="count">({r["size"]})</span></td>'
                    f'{"".join(cells)}<td class="mono">{stopped}{" ◀ desync" if odd_seq is not None else " ◀ behind" if late else ""}</td></tr>')
    more = len(rows) - min(len(rows), MAX_ROWS)
    return (f'<h3>process group {esc(pg_id)}</h3><table class="grid"><thead><tr><th>ranks</th>{head}'
            f'<th>where it stopped</th></tr></thead><tbody>{"".join(body)}</tbody></table>'
            + (f'<p class="dim">and {more} more rows</p>' if more else ""))


LEGEND = ('<p class="legend"><span><i class="done"></i>completed</span>'
          '<span><i class="pend"></i>enqueued, not completed</span><span><i class="none"></i>not issued</span>'
          '<span><i class="desync"></i>desync (ranks issued different collectives)</span> '
          '<span class="dim">columns: collective sequence numbers (last two digits; hover for the number)</span></p>')


def section(fr: dict[str, Any] | None) -> Section | None:
    """The Flight Recorder section, None when no rank had a record."""
    if not fr:
        return None
    records = list(fr.get("ranks") or [])
    analysis = fr.get("analysis")
    findings = list((analysis or {}).get("findings") or [])
    parts = [f'<p><b>{esc(fr.get("evidence") or "")}</b></p>']
    if findings:
        parts.append("<ul>" + "".join(f"<li>{esc(f)}</li>" for f in findings[:20]) + "</ul>")
    desync = _desyncs(analysis)
    rows = group_rows(records, desync)
    if rows:
        parts.append(LEGEND)
        # the groups where ranks parted ways (or desynced) are drawn; the others only counted (a 3D layout of
        # 16k ranks has thousands of groups)
        parted = [k for k in sorted(rows, key=lambda k: (len(k), k)) if len(rows[k]) > 1 or k in desync]
        for pg_id in parted[:MAX_GROUPS]:
            late = {b["rank"] for b in fr.get("behind") or [] if str(b.get("pg_id")) == pg_id and
                    isinstance(b.get("rank"), int)}
            parts.append(grid_html(pg_id, rows[pg_id], desync.get(pg_id), late))
        alike = len(rows) - len(parted)
        if len(parted) > MAX_GROUPS:
            parts.append(f'<p class="dim">and {len(parted) - MAX_GROUPS} more process group(s) where ranks parted '
                         "ways (in the JSON report)</p>")
        if alike:
            parts.append(f'<p class="dim">{alike} process group(s) where every rank stopped at the same '
                         "collective</p>")
    failed = [r for r in records if not r.get("ok")]
    if failed:
        items = "".join(f"<li>rank {esc(r.get('rank'))} ({esc(r.get('host') or '')}): {esc(r.get('error') or '?')}"
                        "</li>" for r in failed[:MAX_ROWS])
        parts.append(f"<p>no record from {len(failed)} rank(s):</p><ul>{items}</ul>")
    behind = fr.get("behind") or []
    return Section("flight-recorder", "Flight Recorder: where each rank stopped", "".join(parts),
                   note=f"{len(records)} ranks" + (f", {len(behind)} behind" if behind else ""))
