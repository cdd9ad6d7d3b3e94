"""The human view of a dump-stacks report: a STAT-style prefix tree, the groups, what was not
dumped, and the verdict as the last line (the one a tired person reads)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ml_debug.core.visible import visible

if TYPE_CHECKING:
    from rich.console import Console

    from ml_debug.stacks.verdict import DumpStacksResult, TreeNode

CHAIN_KEEP = 3  # frames shown at each end of a long chain unless --full


def _chain_lines(frames: list[str], full: bool) -> list[str]:
    if full or len(frames) <= 2 * CHAIN_KEEP + 1:
        return frames
    hidden = len(frames) - 2 * CHAIN_KEEP
    return [*frames[:CHAIN_KEEP], f"… {hidden} frames (--full shows them) …", *frames[-CHAIN_KEEP:]]


def _ranks_cell(ranks: list[int | None], members: list[str]) -> str:
    if ranks and all(r is not None for r in ranks) and len(set(ranks)) == len(ranks):
        from ml_debug.core.ranges import compress

        return compress(r for r in ranks if r is not None)
    return ",".join("pid " + m.rsplit(":", 1)[1] for m in members)


def render(result: DumpStacksResult, console: Console, *, full: bool = False, all_threads: bool = False) -> None:
    from rich.table import Table
    from rich.text import Text
    from rich.tree import Tree

    from ml_debug.stacks.verdict import GroupState, ProcessState

    procs = result.processes
    nodes = result.nodes
    dumped = [p for p in procs if p.state != ProcessState.NOT_DUMPED]
    dumpers = sorted({s.dumper for p in procs for s in p.samples if s.ok and s.dumper})
    samples = result.options.get("samples", 1)
    console.print(f"dump-stacks: {len(procs)} processes on {len(nodes)} node(s) "
                  f"({', '.join(n.host for n in nodes)}); {len(dumped)} dumped"
                  f"{' by ' + ', '.join(dumpers) if dumpers else ''}; {samples} sample(s)")
    for n in nodes:
        if n.error:
            console.print(Text(f"  node {n.host}: not reached: {visible(n.error)}", style="red"))
        for note in n.notes:
            console.print(f"  node {n.host}: {visible(note)}")

    suspect_groups = {s.group for s in result.suspects if s.group}
    groups = {g.id: g for g in result.groups}
    if result.tree:
        console.print()
        tree = Tree("main-thread stacks, outermost frame first (STAT-style: ranks that share a prefix share a "
                    "branch)", guide_style="dim")

        def add(parent: Any, node: TreeNode) -> None:
            frames, last = node.chain()
            label = Text()
            label.append(f"[{node.ranks}]", style="bold cyan")
            label.append(f" ({node.count})")
            leaf = not last.children
            if leaf:
                gid = last.groups[0]
                g = groups[gid]
                label.append(f"  group {gid}", style="dim")
                if g.state != GroupState.SINGLE:
                    label.append(f", {g.state}", style="dim")
                if g.gpu_wait:
                    label.append(f"  waiting on the GPU in {g.gpu_wait.name.split('(', 1)[0]}", style="yellow")
                elif g.collective:
                    label.append(f"  waiting in {g.collective.name}", style="yellow")
                if gid in suspect_groups:
                    label.append("  ◀ SUSPECT", style="bold red")
            shown = _chain_lines(frames, full)
            if len(shown) == 1 and not leaf:
                label.append(f" {shown[0]}")
            else:
                for i, frame in enumerate(shown):
                    label.append("\n" + ("  " if i == 0 else "→ ") + frame)
            branch = parent.add(label)
            for child in last.children:
                add(branch, child)

        for root in result.tree:
            add(tree, root)
        console.print(tree)

    if result.groups:
        console.print()
        table = Table(title="groups (identical main-thread stacks)", title_justify="left", show_edge=False)
        for col in ("group", "ranks", "procs", "hosts", "state", "where (innermost own frame)", "waiting in"):
            table.add_column(col)
        for g in result.groups:
            table.add_row(g.id + (" ◀" if g.id in suspect_groups else ""),
                          _ranks_cell(g.ranks, g.members), str(g.size), ",".join(g.hosts),
                          "-" if g.state == GroupState.SINGLE else str(g.state),
                          g.location.where if g.location else "-",
                          f"the GPU: {g.gpu_wait.where}" if g.gpu_wait else
                          g.collective.where if g.collective else "-")
        console.print(table)

    if all_threads:
        _threads(result, console)

    if result.not_dumped:
        console.print()
        table = Table(title="not dumped", title_justify="left", show_edge=False)
        for col in ("host", "pid", "rank", "reason", "what to do"):
            table.add_column(col)
        for nd in result.not_dumped:
            table.add_row(nd.host, str(nd.pid), "-" if nd.rank is None else str(nd.rank), visible(nd.error or "?"),
                          visible(nd.fix or ""))
        console.print(table)
    if result.missing_ranks:
        from ml_debug.core.ranges import compress

        console.print(Text(f"missing ranks (no process found): {compress(result.missing_ranks)}", style="red"))

    if any(p.kernel for p in procs):
        _below_python(result, console)
    if result.loop_order:
        console.print()
        console.print(Text(f"loop order (--locals): {visible(result.loop_order['text'])}", style="yellow"))

    if result.flight_recorder:
        _flight_recorder(result.flight_recorder, console)

    console.print()
    style = "bold green" if result.ok else "bold red"
    console.print(Text(visible(result.summary), style=style), soft_wrap=True)  # one line, whatever the width


def _below_python(result: DumpStacksResult, console: Console) -> None:
    """Processes grouped by what the kernel said of them (the call and its file, state, spinning)."""
    from rich.table import Table

    by_verdict: dict[str, list[Any]] = {}
    for p in result.processes:
        if p.kernel and p.kernel.get("verdict"):
            by_verdict.setdefault(str(p.kernel["verdict"]), []).append(p)
    console.print()
    table = Table(title="below Python (what the kernel says: /proc/PID/syscall, wchan, fd)", title_justify="left",
                  show_edge=False)
    for col in ("ranks", "procs", "hosts", "kernel"):
        table.add_column(col)
    for verdict, ps in sorted(by_verdict.items(), key=lambda kv: len(kv[1])):
        table.add_row(_ranks_cell([p.rank for p in ps], [f"{p.host}:{p.pid}" for p in ps]), str(len(ps)),
                      ",".join(sorted({p.host for p in ps})), visible(verdict))
    console.print(table)


def _threads(result: DumpStacksResult, console: Console) -> None:
    from rich.table import Table

    table = Table(title="all threads (last sample)", title_justify="left", show_edge=False)
    for col in ("host", "pid", "rank", "thread", "innermost frames"):
        table.add_column(col)
    for p in result.processes:
        ok = [s for s in p.samples if s.ok]
        if not ok:
            continue
        for t in ok[-1].threads:
            frames = t.frames or t.native_frames
            text = " ← ".join(visible(f.name) for f in frames[:4]) or "(no frames)"
            name = visible(t.name or t.thread_id) + (" (main)" if t.is_main else "")
            table.add_row(p.host, str(p.pid), "-" if p.rank is None else str(p.rank), name, text)
    console.print()
    console.print(table)


def _coll(c: dict[str, Any] | None, seq: int | None) -> str:
    if c and c.get("op"):
        return visible(f"#{c['seq']} {c['op']}" + (f" {c['input_sizes']}" if c.get("input_sizes") else ""))
    return "-" if seq is None or seq < 0 else f"#{seq}"


def _flight_recorder(fr: dict[str, Any], console: Console) -> None:
    from rich.table import Table
    from rich.text import Text

    behind = {(b.get("host"), b.get("pid")) for b in fr["behind"]}
    table = Table(title="flight recorder (last collectives per rank and process group)", title_justify="left",
                  show_edge=False)
    for col in ("rank", "host", "pg", "last completed", "last enqueued", "note"):
        table.add_column(col)
    for r in fr["ranks"]:
        rank = "-" if r.get("rank") is None else str(r["rank"])
        if not r.get("ok"):
            table.add_row(rank, r.get("host") or "", "-", "-", "-", visible(r.get("error") or "?"))
            continue
        for pg in r["process_groups"]:
            note = "◀ behind" if (r.get("host"), r.get("pid")) in behind else ""
            table.add_row(rank, r.get("host") or "", pg["pg_id"],
                          _coll(pg.get("last_completed"), pg.get("last_completed_seq")),
                          _coll(pg.get("last_enqueued"), pg.get("last_enqueued_seq")), note)
    console.print()
    console.print(table)
    findings = (fr.get("analysis") or {}).get("findings") or []
    for line in findings:  # the collectives matched across ranks (ml_debug.stacks.fr_analysis)
        console.print(Text(f"  {visible(line)}", style="yellow"), soft_wrap=True)
    console.print(Text(visible(fr["evidence"]), style="yellow" if fr["behind"] or findings else ""), soft_wrap=True)
