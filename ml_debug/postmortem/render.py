"""The human view of a post-mortem: the verdict from every source first, then what each source said, where
they disagree, and which files were read and which could not be (a job's strings shown with
:func:`ml_debug.core.visible.visible`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ml_debug.core.visible import visible
from ml_debug.postmortem.accounting import size_text

if TYPE_CHECKING:
    from rich.console import Console

    from ml_debug.postmortem.collect import Postmortem

MAX_ROWS = 25


def render(pm: Postmortem, console: Console) -> None:
    from rich.table import Table
    from rich.text import Text

    v = pm.verdict
    title = f"post-mortem of Slurm job {pm.job_id}" if pm.job_id else "post-mortem"
    console.print(Text(f"\n{title}", style="bold"))
    console.print(Text(visible(v.summary), style="bold red" if v.failed else "bold green"), soft_wrap=True)
    if v.named_by:
        console.print(Text(f"  named by: {v.named_by}", style="dim"))
    for f in v.findings:
        console.print(Text(f"  {f.source}: {visible(f.sentence)}"
                           + (f"  [{f.where()}]" if f.rank is not None or f.node else "")), soft_wrap=True)
    for d in v.disagreements:
        console.print(Text(f"  sources disagree: {visible(d)}", style="yellow"), soft_wrap=True)
    acc = pm.accounting
    if acc:
        t = Table(title="Slurm accounting (sacct)", title_justify="left", show_edge=False)
        for col in ("step", "state", "exit", "nodes", "tasks", "MaxRSS (task, node)", "limit"):
            t.add_column(col)
        for s in acc["steps"][:MAX_ROWS]:
            state = s["state"] + (f" by {s['cancelled_by']}" if s.get("cancelled_by") else "")
            code = "" if s["exit_code"] is None else f"{s['exit_code']}" + (f":{s['signal']}" if s.get("signal") else "")
            rss = "" if s["max_rss"] is None else f"{size_text(s['max_rss'])} ({s['max_rss_task']}, {s['max_rss_node']})"
            t.add_row(visible(s["id"]), state, code, visible(",".join(s["nodes"])),
                      "" if s["ntasks"] is None else str(s["ntasks"]), rss,
                      "" if s.get("req_mem") is None else size_text(s["req_mem"]))
        console.print(t)
        for e in acc.get("node_events") or []:
            console.print(Text(f"  node event: {visible(e['node'])} {e['state']} ({visible(e['reason'])}) "
                               f"by {visible(e['user'])}"), soft_wrap=True)
    for k in pm.kernel:
        if not k["readable"]:
            console.print(Text(f"kernel log of {visible(k['node'])}: not read: {visible(k['reason'] or '?')}",
                               style="yellow"), soft_wrap=True)
            continue
        events = k["events"]
        console.print(Text(f"kernel log of {visible(k['node'])} ({k['source']}, {k['lines']} lines): "
                           + (f"{len(events)} event(s)" if events else "nothing about the job")), soft_wrap=True)
        for e in events[:MAX_ROWS]:
            console.print(Text(f"  {visible(e['what'])}"), soft_wrap=True)
    fr = pm.flight_recorder
    if fr:
        console.print(Text(f"Flight Recorder ({len(fr.get('files') or [])} dump file(s)): "
                           f"{visible(fr.get('evidence') or 'no analysis')}"), soft_wrap=True)
    for n in pm.notes:
        console.print(Text(f"note: {visible(n)}", style="dim"), soft_wrap=True)
    if pm.logs_error:
        console.print(Text(f"logs: {visible(pm.logs_error)}", style="yellow"), soft_wrap=True)
    console.print(Text(f"read: {len(pm.files_read)} file(s)", style="dim"))
    for path in pm.files_read[:MAX_ROWS]:
        console.print(Text(f"  {visible(path)}", style="dim"), soft_wrap=True)
    for u in pm.files_unreadable:
        console.print(Text(f"not read: {visible(u['path'])}: {visible(u['reason'])}", style="yellow"), soft_wrap=True)
