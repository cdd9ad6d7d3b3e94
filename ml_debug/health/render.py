"""Human view of a health result (the JSON-able dict): one table per node, a cluster table
when there are several, and the summary line."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ml_debug.health.result import HealthResult, Status

if TYPE_CHECKING:
    from rich.console import Console

STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim", "info": "cyan"}
FAKE_MARK = "FAKE NVML"


def _fake_source(node: dict[str, Any]) -> str | None:
    """The node's NVML source when it is a test's look-alike (``fake:...``), else None."""
    source = str(node.get("gpu", {}).get("nvml_source") or "")
    return source if source.startswith("fake:") else None


def _label(c: dict[str, Any]) -> str:
    target, cid = c["target"], c["id"]
    short = cid.split(".", 1)[-1]
    return cid.replace(".", " ", 1) if target in ("host", "node", "cluster") else f"{target} {short}"


def node_table(node: dict[str, Any], show_pass: bool = True) -> Any:
    from rich.table import Table

    title = f"{node.get('target') or node['host']}: {node['gpu']['message']} (level {node['level']}, {node['duration_s']:.1f} s)"
    if _fake_source(node):
        title += f" [{FAKE_MARK}]"
    t = Table(title=title, title_justify="left", show_lines=False)
    for col, kw in (("check", {"no_wrap": True}), ("status", {"no_wrap": True}), ("value", {}),
                    ("threshold", {}), ("hint", {"ratio": 1})):
        t.add_column(col, **kw)
    for c in node["checks"]:
        if not show_pass and c["status"] in ("pass", "info", "skip"):
            continue
        st = c["status"]
        t.add_row(_label(c), f"[{STYLE[st]}]{st.upper()}[/]", str(c["value"]), str(c["threshold"]), c["hint"] or "")
    return t


def cluster_table(result: HealthResult) -> Any:
    from rich.table import Table

    t = Table(title="cluster", title_justify="left")
    for col in ("node", "verdict", "gpus", "fail", "warn", "summary"):
        t.add_column(col, ratio=1 if col == "summary" else None, no_wrap=col != "summary")
    for n in result.nodes:
        verdict = "[green]OK[/]" if n["ok"] else ("[bold red]FAIL[/]" if n["exit_code"] == 1 else "[yellow]NO GPU[/]")
        gpus = str(len(n["gpu"].get("gpus", []))) if n["gpu"]["present"] else "0"
        if _fake_source(n):
            gpus += f" ({FAKE_MARK})"
        t.add_row(n.get("target") or n["host"], verdict, gpus, str(n["counts"]["fail"]), str(n["counts"]["warn"]),
                  n["summary"])
    for u in result.unreachable:
        t.add_row(u.host, "[bold red]UNREACHED[/]", "-", "-", "-", u.reason)
    return t


def draw(console: Console, result: HealthResult, verbose: bool = True) -> None:
    """Per-node tables (only problems when there are many nodes and not verbose), then the summary."""
    many = len(result.nodes) + len(result.unreachable) > 1
    fakes = [(n.get("target") or n["host"], src) for n in result.nodes if (src := _fake_source(n))]
    if fakes:
        # Test data must never read as real hardware: say so before any table.
        where = ", ".join(f"{name} ({src})" for name, src in fakes)
        console.print(f"[bold magenta]{FAKE_MARK}[/]: the GPU data of {where} comes from a test's NVML "
                      "look-alike, not from a GPU")
    for node in result.nodes:
        if many and not verbose and node["ok"] and not node["counts"]["warn"]:
            continue
        console.print(node_table(node, show_pass=verbose))
        console.print()
    if many:
        console.print(cluster_table(result))
        for c in result.cluster_checks:
            if c.status is not Status.PASS:
                console.print(f"[{STYLE[c.status]}]{c.status.upper()}[/] {c.id}: {c.value}: {c.hint}")
    style = "green" if result.ok else "bold red"
    console.print(f"[{style}]{result.summary}[/]")
