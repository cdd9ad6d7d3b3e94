"""The node views of a watch incident: the ranks as the watcher saw them (its top view: state, CPU,
GPU, progress), and health of the suspect's node; outliers marked. Drawn from the bundle's parts
(``watch.json``'s snapshot and the health document's result)."""

from __future__ import annotations

from typing import Any

from ml_debug.page.shell import Section
from ml_debug.page.text import esc

MAX_ROWS = 500


def _num(v: Any, fmt: str = "{:.0f}") -> str:
    return fmt.format(v) if isinstance(v, (int, float)) else ""


def ranks_html(snapshot: dict[str, Any], incident: dict[str, Any], culprit: dict[str, Any] | None = None) -> str:
    """One row per rank; the culprit, the ranks the incident is about (all of them when it was requested:
    not marked) and those with signs of trouble first, marked."""
    named = set() if incident.get("kind") == "requested" else \
        {(r.get("host"), r.get("pid")) for r in incident.get("ranks") or []}
    if culprit:
        named.add((culprit.get("host"), culprit.get("pid")))
    rows = []
    for r in snapshot.get("ranks") or []:
        odd = (r.get("host"), r.get("pid")) in named
        troubled = bool(r.get("signs")) or r.get("status") not in (None, "ok")
        utils = [g.get("util_pct") for g in r.get("gpu") or [] if isinstance(g, dict)]
        util = max((u for u in utils if isinstance(u, (int, float))), default=None)
        rank = "" if r.get("rank") is None else str(r["rank"])
        cells = [f'<span data-ranks="{esc(rank)}">{esc(rank or "?")}</span>', esc(r.get("node") or r.get("host") or ""),
                 esc(r.get("pid") or ""), esc(r.get("status") or ""), esc(r.get("state") or ""),
                 _num(r.get("cpu_pct")), _num(util),
                 _num(r.get("idle_s"), "{:.1f}"), f"<code>{esc(r.get('where') or '')}</code>",
                 esc("; ".join(str(s) for s in r.get("signs") or []) or r.get("straggler_why") or "")]
        rows.append((not odd, not troubled, r.get("rank") or 0, "outlier" if odd else "warn" if troubled else "", cells))
    rows.sort(key=lambda x: (x[0], x[1], x[2]))
    head = ["rank", "node", "pid", "status", "state", "CPU %", "GPU %", "idle s", "where", "signs"]
    body = "".join(f'<tr class="{cls}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
                   for _, _, _, cls, cells in rows[:MAX_ROWS])
    more = len(rows) - min(len(rows), MAX_ROWS)
    nodes = [n for n in snapshot.get("nodes") or [] if not n.get("answering", True) or n.get("error")]
    silent = "".join(f"<li>node {esc(n.get('label'))}: {esc(n.get('error') or 'not answering')}</li>" for n in nodes)
    return ("<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + f"</tr></thead><tbody>{body}"
            "</tbody></table>" + (f'<p class="dim">and {more} more rank(s)</p>' if more else "")
            + (f"<ul>{silent}</ul>" if silent else ""))


def health_html(health: dict[str, Any]) -> str:
    """Every check of every node in the health result; the ones that did not pass first."""
    out = [f"<p><b>{esc(health.get('summary') or '')}</b></p>"]
    for node in health.get("nodes") or []:
        checks = list(node.get("checks") or [])
        checks.sort(key=lambda c: {"fail": 0, "warn": 1}.get(str(c.get("status")), 2))
        rows = []
        for c in checks:
            st = str(c.get("status"))
            cls = "outlier" if st == "fail" else "warn" if st == "warn" else ""
            rows.append(f'<tr class="{cls}"><td>{esc(c.get("id"))}</td><td>{esc(c.get("target"))}</td><td>{esc(st)}'
                        f'</td><td>{esc(c.get("value"))}</td><td>{esc(c.get("threshold"))}</td>'
                        f'<td>{esc(c.get("hint"))}</td></tr>')
        out.append(f"<h3>{esc(node.get('host') or node.get('target') or '')}</h3><table><thead><tr><th>check</th>"
                   "<th>target</th><th>status</th><th>value</th><th>passes when</th><th>what to do</th></tr></thead>"
                   f"<tbody>{''.join(rows)}</tbody></table>")
    return "".join(out)


def sections(snapshot: dict[str, Any] | None, incident: dict[str, Any], health: dict[str, Any] | None,
             culprit: dict[str, Any] | None = None) -> list[Section]:
    out = []
    if snapshot:
        out.append(Section("ranks", "ranks as the watcher saw them", ranks_html(snapshot, incident, culprit),
                           note=f"{len(snapshot.get('ranks') or [])} ranks on {len(snapshot.get('nodes') or [])} "
                                "node(s)"))
    if health:
        out.append(Section("health", "health of the suspect's node", health_html(health),
                           open=not health.get("ok", True)))
    return out
