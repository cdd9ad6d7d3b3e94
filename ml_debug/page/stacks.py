"""The dump-stacks views: the merged stack tree (suspect opened, its below-Python line beside it), the
suspects, the groups, the nodes and what was not dumped. Drawn from ``stacks.verdict.DumpStacksResult``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ml_debug.page.shell import Section
from ml_debug.page.text import esc

if TYPE_CHECKING:
    from ml_debug.stacks.verdict import DumpedProcess, DumpStacksResult, StackGroup, TreeNode

MAX_ROWS = 500  # rows of a long table (nodes, not dumped); the rest is counted, all fine or all alike
CHAIN_KEEP = 3  # frames named at each end of a long chain in a branch's title


def rank_spec(ranks: str) -> str:
    """``"0-2,5"`` of the tree's ``"ranks 0-2,5"`` (what the page's rank finder reads); "" for pids."""
    for prefix in ("ranks ", "rank "):
        if ranks.startswith(prefix):
            return ranks[len(prefix):]
    return ""


def _ranks_of(ranks: list[int | None], members: list[str]) -> str:
    from ml_debug.core.ranges import compress

    known = [r for r in ranks if r is not None]
    if known and len(known) == len(ranks):
        return compress(known)
    return ",".join("pid " + m.rsplit(":", 1)[1] for m in members[:20]) + (" …" if len(members) > 20 else "")


def _below(group: StackGroup, by_member: dict[str, DumpedProcess]) -> list[str]:
    """What the kernel says of a group's processes (the first four): the line beside the suspect."""
    out = []
    for m in group.members[:4]:
        p = by_member.get(m)
        said = (p.kernel or {}).get("verdict") if p is not None else None
        if p is not None and said:
            who = f"rank {p.rank}" if p.rank is not None else f"pid {p.pid}"
            out.append(f"{who} ({p.host}): {str(said).split(', wait channel', 1)[0]}")
    return out


def tree_html(result: DumpStacksResult) -> str:
    """Nested ``<details>``: outermost frame first; a branch that leads to a suspect is open and marked."""
    suspect_groups = {s.group for s in result.suspects if s.group}
    reason = {s.group: s.reason for s in result.suspects if s.group}
    groups = {g.id: g for g in result.groups}
    by_member = {f"{p.host}:{p.pid}": p for p in result.processes}
    out: list[str] = []

    def leaf(last: TreeNode) -> str:
        parts = []
        for gid in last.groups:
            g = groups.get(gid)
            if g is None:
                continue
            suspect = gid in suspect_groups
            bits = [f'<span class="tag {"bad" if suspect else "ok"}">group {esc(gid)}</span>']
            if suspect:
                bits.append(f'<span class="tag bad">suspect</span> {esc(reason.get(gid, ""))}')
            if g.collective:
                bits.append(f'waits in <code>{esc(g.collective.where)}</code>')
            bits.append(f'<span class="dim">{esc(g.state)}; on {esc(", ".join(g.hosts[:5]))}'
                        f'{" …" if len(g.hosts) > 5 else ""}</span>')
            below = _below(g, by_member) if suspect else []  # beside the suspect, as the verdict says it
            if below:
                bits.append('<div class="below">below Python: ' + esc("; ".join(below)) + "</div>")
            parts.append(f'<div class="leaf{" suspect" if suspect else ""}">{" ".join(bits)}</div>')
        return "".join(parts)

    def add(node: TreeNode, depth: int) -> None:
        frames, last = node.chain()
        onpath = bool(suspect_groups.intersection(node.groups))
        opened = onpath or (not suspect_groups and depth == 0)
        spec = rank_spec(node.ranks)
        if len(frames) > 2 * CHAIN_KEEP + 1:
            title = [*frames[:CHAIN_KEEP], f"… {len(frames) - 2 * CHAIN_KEEP} frames …", *frames[-CHAIN_KEEP:]]
        else:
            title = frames
        label = esc(title[-1]) if len(title) == 1 else " → ".join(f"<code>{esc(f)}</code>" for f in title)
        if len(title) == 1:
            label = f"<code>{label}</code>"
        mine = bool(node.groups) and set(node.groups) <= suspect_groups  # the suspect's own branch: marked
        out.append(f'<li><details class="branch{" onpath" if onpath else ""}{" mine" if mine else ""}" '
                   f'data-count="{node.count}" data-frame="{esc(frames[-1])}"{" open" if opened else ""}>'
                   f'<summary><span class="ranks" data-ranks="{esc(spec)}">[{esc(node.ranks)}]</span> '
                   f'<span class="count">({node.count})</span> {label}</summary>')
        if len(frames) > 1:
            out.append('<ol class="chain">' + "".join(f"<li><code>{esc(f)}</code></li>" for f in frames) + "</ol>")
        if last.children:
            out.append('<ul>')
            for child in last.children:
                add(child, depth + 1)
            out.append('</ul>')
        else:
            out.append(leaf(last))
        out.append("</details></li>")

    out.append('<div class="toolbar"><button type="button" data-act="open-all" data-scope="stack-tree">open all'
               '</button><button type="button" data-act="close-all" data-scope="stack-tree">close all</button>'
               '<button type="button" data-act="suspect" data-scope="stack-tree">only the suspect</button>'
               '<button type="button" data-act="icicle" data-scope="stack-tree">icicle</button></div>'
               '<div id="icicle" class="icicle" hidden></div>')
    out.append('<ul class="tree" id="stack-tree">')
    for root in result.tree:
        add(root, 0)
    out.append("</ul>")
    return "".join(out)


def _table(head: list[str], rows: list[tuple[str, list[str]]]) -> str:
    """A table whose cells are HTML already; each row with its CSS class."""
    h = "".join(f"<th>{esc(c)}</th>" for c in head)
    body = "".join(f'<tr class="{cls}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>" for cls, cells in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def suspects_html(result: DumpStacksResult) -> str:
    if not result.suspects:
        return '<p class="dim">no suspect: every rank is where the others are</p>'
    from ml_debug.core.ranges import compress

    rows = []
    for s in result.suspects:
        ranks = compress(s.ranks)  # "" for a pid without a rank: the processes column names it
        rows.append(("suspect", [esc(s.kind), f'<span data-ranks="{esc(ranks)}">{esc(ranks)}</span>',
                                 f"<code>{esc(s.where or '')}</code>", esc(s.reason),
                                 esc(", ".join(s.members[:8]) + (" …" if len(s.members) > 8 else ""))]))
    return _table(["kind", "ranks", "where", "why", "processes"], rows)


def groups_html(result: DumpStacksResult) -> str:
    suspect_groups = {s.group for s in result.suspects if s.group}
    rows = []
    for g in result.groups:
        ranks = _ranks_of(g.ranks, g.members)
        rows.append(("suspect" if g.id in suspect_groups else "",
                     [esc(g.id), str(g.size), f'<span data-ranks="{esc(ranks)}">{esc(ranks)}</span>', esc(g.state),
                      f"<code>{esc(g.location.where if g.location else '')}</code>",
                      f"<code>{esc(g.collective.where if g.collective else '')}</code>",
                      esc(", ".join(g.hosts[:5]) + (f" and {len(g.hosts) - 5} more" if len(g.hosts) > 5 else ""))]))
    return _table(["group", "size", "ranks", "state", "innermost frame", "collective", "hosts"], rows)


def nodes_html(result: DumpStacksResult) -> str:
    """One row per node; a node not reached, with ranks not dumped, or with the suspect is an outlier (first)."""
    suspect_hosts = {m.rsplit(":", 1)[0] for s in result.suspects for m in s.members}
    rows = []
    for n in result.nodes:
        outlier = bool(n.error) or n.dumped < n.targets or n.host in suspect_hosts
        why = n.error or (f"{n.targets - n.dumped} not dumped" if n.dumped < n.targets else "") or \
            ("the suspect's node" if n.host in suspect_hosts else "")
        rows.append((outlier, n.host, ["outlier" if outlier else "", esc(n.host), str(n.targets), str(n.dumped),
                                       f"{n.seconds:.1f}", esc(why), esc("; ".join(n.notes))]))
    rows.sort(key=lambda r: (not r[0], r[1]))
    shown = [(r[2][0], r[2][1:]) for r in rows[:MAX_ROWS]]
    more = len(rows) - len(shown)
    tail = f'<p class="dim">and {more} more node(s), none an outlier</p>' if more else ""
    return _table(["node", "processes", "dumped", "seconds", "outlier because", "notes"], shown) + tail


def not_dumped_html(result: DumpStacksResult) -> str:
    rows = [("warn", [esc(n.host), str(n.pid), esc("" if n.rank is None else n.rank), esc(n.error or ""),
                      esc(n.fix or "")]) for n in result.not_dumped[:MAX_ROWS]]
    more = len(result.not_dumped) - len(rows)
    return _table(["node", "pid", "rank", "why", "what to do"], rows) + \
        (f'<p class="dim">and {more} more</p>' if more else "")


def sections(result: DumpStacksResult) -> list[Section]:
    """The dump-stacks sections, the tree first; the Flight Recorder's is added by ``page.flight``."""
    out = [Section("stacks", "merged stacks (outermost frame first; ranks that share a prefix share a branch)",
                   tree_html(result) if result.tree else '<p class="dim">no stack was dumped</p>',
                   note=f"{len(result.processes)} processes, {len(result.groups)} distinct stacks"),
           Section("suspects", "suspects", suspects_html(result), note=str(len(result.suspects))),
           Section("groups", "groups of identical stacks", groups_html(result), open=False,
                   note=str(len(result.groups))),
           Section("nodes", "nodes", nodes_html(result), open=any(n.error for n in result.nodes),
                   note=str(len(result.nodes)))]
    if result.not_dumped:
        out.append(Section("not-dumped", "not dumped", not_dumped_html(result), note=str(len(result.not_dumped))))
    return out
