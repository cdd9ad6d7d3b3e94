"""The score table of `mldebug drill`."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ml_debug.drill.result import CORRECT, MISSED, DrillOutcome, DrillResult

STYLE = {CORRECT: "green", MISSED: "bold red"}


def injected_text(o: DrillOutcome) -> str:
    i = o.injected
    node = f" ({i.node})" if i.node else ""
    if i.peer is not None:
        return f"link {i.rank}<->{i.peer}{node}"
    at = f" step {i.step}" if i.step else ""
    return f"rank {i.rank}{node}{at}"


def named_text(o: DrillOutcome) -> str:
    if not o.named.ranks:
        return "-"
    if o.injected.peer is not None:
        return f"slow link {o.named.where}" if o.named.where else "ranks " + ",".join(map(str, o.named.ranks))
    ranks = ",".join(map(str, o.named.ranks))
    node = f" ({o.named.node})" if o.named.node else ""
    return f"rank {ranks}{node}" + (f": {o.named.where}" if o.named.where else "")


def short(text: str, width: int) -> str:
    """``text`` cut at a word boundary to about ``width`` characters (the JSON has it whole)."""
    if len(text) <= width:
        return text
    cut = text.rfind(" ", 0, width - 2)
    return text[:cut if cut > 0 else width - 2] + " …"


def outcome_line(o: DrillOutcome) -> str:
    """One line per finished drill, for stderr while the drills run."""
    took = f" in {o.time_to_verdict_s:.1f} s" if o.time_to_verdict_s is not None else ""
    tail = f": {o.why}" if o.why else ""
    return f"drill {o.drill}: {o.status}{took} (injected {injected_text(o)}; {o.diagnosis}){tail}"


def render(result: DrillResult, console: Console) -> None:
    table = Table(title=f"mldebug drill: {result.summary}", title_justify="left")
    for column in ("drill", "injected", "diagnosis", "named", "result", "verdict in", "evidence"):
        table.add_column(column, overflow="fold")
    for o in result.drills:
        took = f"{o.time_to_verdict_s:.1f} s" if o.time_to_verdict_s is not None else "-"
        status = Text(o.status if not o.why else f"{o.status}: {o.why}", style=STYLE.get(o.status, "yellow"))
        table.add_row(o.drill, injected_text(o), short(o.diagnosis, 44), short(named_text(o), 48), status, took,
                      o.evidence)
    console.print(table)
    for note in result.notes:
        console.print(Text(note, style="dim"))
