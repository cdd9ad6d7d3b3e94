"""How a snapshot looks: one table (a row per node; GPU and rank rows under it on request), the
outliers under it, and the full-screen live view with its keys.

Everything here draws the ``result`` dict of :func:`ml_debug.top.result.snapshot`, the same data
``--json`` prints, so what a person sees and what a script reads cannot disagree.
"""

from __future__ import annotations

import os
import re
import select
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ml_debug.core.ranges import compress
from ml_debug.top.options import SORT_KEYS
from ml_debug.top.verdict import BADGE_WORDS, KIND_WORDS

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.text import Text

KEYS_HELP = "q quit · g GPU rows · r rank rows · s sort · ↑/↓ or j/k select · d dump-stacks of the selected node"
MAX_OUTLIER_LINES = 8


# ------------------------------------------------------------------------------- formatting


def size(n: Any) -> str:
    if n is None:
        return "N/A"
    n = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}T"


def pct(v: Any, digits: int = 0) -> str:
    return "N/A" if v is None else f"{float(v):.{digits}f}%"


def num(v: Any, digits: int = 2) -> str:
    return "" if v is None else f"{float(v):.{digits}f}"


def age(seconds: Any) -> str:
    if seconds is None:
        return ""
    s = float(seconds)
    if s < 90:
        return f"{s:.0f}s"
    if s < 5400:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.1f}h"


def _natural(label: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", label)]


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def node_figures(node: dict[str, Any]) -> dict[str, Any]:
    """What a node row shows of its GPUs and ranks: means, sums, the median step rate."""
    gpus, ranks = node["gpus"], node["ranks"]
    util = [float(g["util_pct"]) for g in gpus if g.get("util_pct") is not None]
    power = [float(g["power_pct"]) for g in gpus if g.get("power_pct") is not None]
    temps = [float(g["temp_c"]) for g in gpus if g.get("temp_c") is not None]
    used = [g["mem_used_bytes"] for g in gpus if g.get("mem_used_bytes") is not None]
    total = [g["mem_total_bytes"] for g in gpus if g.get("mem_total_bytes") is not None]
    rates = [float(r["progress"]["rate"]) for r in ranks if r.get("progress") and r["progress"].get("rate") is not None]
    rates += [float(p["rate"]) for p in node["progress"] if p.get("rate") is not None and p.get("rank") is None]
    steps = [r["progress"]["step"] for r in ranks if r.get("progress") and r["progress"].get("step") is not None]
    states: dict[str, int] = {}
    for r in ranks:
        states[str(r.get("state"))] = states.get(str(r.get("state")), 0) + 1
    return {"util": _mean(util), "power": _mean(power), "temp": max(temps) if temps else None,
            "gpu_used": sum(used) if used else None, "gpu_total": sum(total) if total else None,
            "rate": _median(rates), "step": min(steps) if steps else None, "states": states}


def sort_nodes(nodes: list[dict[str, Any]], key: str, flagged: dict[str, int]) -> list[dict[str, Any]]:
    """The node rows in the order ``key`` asks for (see options.SORT_KEYS)."""
    by_name = sorted(nodes, key=lambda n: _natural(n["target"]))
    if key == "cpu":
        return sorted(by_name, key=lambda n: -(n["cpu_pct"] if n["cpu_pct"] is not None else -1))
    if key == "gpu":
        return sorted(by_name, key=lambda n: -(node_figures(n)["util"] or -1))
    if key == "rate":
        def rate(n: dict[str, Any]) -> float:
            r = node_figures(n)["rate"]
            return float("inf") if r is None else r
        return sorted(by_name, key=rate)
    if key == "flags":
        return sorted(by_name, key=lambda n: (n["status"] == "ok", -flagged.get(n["target"], 0)))
    return by_name


# ------------------------------------------------------------------------------- the table

COLUMNS = ("NODE", "STATE", "CPU", "MEM", "RANKS", "GPU", "POWER", "GPU MEM", "TEMP", "STEP", "STEP/S", "FLAGS")
LEFT = frozenset({0, 1, len(COLUMNS) - 1})


@dataclass
class Row:
    """One line of the table: its cells, a style per cell ("" for none), the style of the whole line."""

    cells: list[str]
    styles: list[str]
    style: str = ""
    node: str | None = None  # the node a node row stands for (selection)


def _row(cells: list[tuple[str, str]], style: str = "", node: str | None = None) -> Row:
    cells = cells + [("", "")] * (len(COLUMNS) - len(cells))
    return Row([c for c, _ in cells], [s for _, s in cells], style, node)


def table_rows(result: dict[str, Any], *, gpus: bool, ranks: bool, sort: str = "node",
               selected: str | None = None) -> list[Row]:
    """The snapshot as table rows: one per node, and its GPUs and ranks under it when asked."""
    flagged: dict[str, int] = {}
    marks: dict[tuple[str, str, Any], list[str]] = {}  # (node, "rank"|"gpu", pid|index) -> kinds
    for o in result["outliers"]:
        flagged[o["node"]] = flagged.get(o["node"], 0) + 1
        if o["pid"] is not None:
            marks.setdefault((o["node"], "rank", o["pid"]), []).append(o["kind"])
        elif o["gpu"] is not None:
            marks.setdefault((o["node"], "gpu", o["gpu"]), []).append(o["kind"])
    rows: list[Row] = []
    for node in sort_nodes(result["nodes"], sort, flagged):
        f = node_figures(node)
        ok = node["status"] == "ok"
        dim = "" if ok else "dim"
        line_style = "reverse" if node["target"] == selected else dim
        if ok:
            state = ("ok", "green")
        else:
            state = (node["status"] + (f" {age(node['age_s'])}" if node["age_s"] is not None else ""), "bold red")
        name = node["target"] if not node["host"] or node["host"] == node["target"] else \
            f"{node['target']} ({node['host']})"
        nvml = node.get("nvml") or {}
        n_gpus = len(node["gpus"])
        flags = []
        if flagged.get(node["target"]):
            flags.append(f"{flagged[node['target']]} outlier(s)")
        if node.get("note"):
            flags.append("version differs")
        if str(nvml.get("source", "")).startswith("fake:"):
            flags.append("FAKE NVML")
        states = " ".join(f"{k}{v}" for k, v in sorted(f["states"].items()))
        rows.append(_row([
            (name, "bold"), state, (pct(node["cpu_pct"]), ""),
            (f"{size(node['mem_used_bytes'])}/{size(node['mem_total_bytes'])}" if node["mem_total_bytes"] else "", ""),
            (f"{len(node['ranks'])} {states}".strip() if node["ranks"] or ok else "", ""),
            (pct(f["util"]) if n_gpus else ("-" if nvml and not nvml.get("available") else ""), ""),
            (pct(f["power"]) if n_gpus else "", ""),
            (f"{size(f['gpu_used'])}/{size(f['gpu_total'])}" if f["gpu_total"] else "", ""),
            (f"{f['temp']:.0f}C" if f["temp"] is not None else "", ""),
            ("" if f["step"] is None else str(f["step"]), ""), (num(f["rate"]), ""),
            (" ".join(flags), "bold yellow" if flagged.get(node["target"]) else "yellow"),
        ], line_style, node["target"]))
        if gpus:
            if not n_gpus and ok:
                rows.append(_row([("  GPUs", "dim"), ("N/A", "dim")] + [("", "")] * (len(COLUMNS) - 3) +
                                 [(str(nvml.get("reason") or "no GPU"), "dim")]))
            for g in node["gpus"]:
                kinds = marks.get((node["target"], "gpu", g["index"]), [])
                badges = [BADGE_WORDS.get(t, t) for t in g.get("throttle") or []]
                if g.get("ecc_uncorrected"):
                    badges.append(f"ECC {g['ecc_uncorrected']}")
                if g.get("xid"):
                    badges.append("Xid " + ",".join(map(str, g["xid"])))
                words = [KIND_WORDS.get(k, k) for k in kinds if k not in ("throttle", "ecc", "xid")]
                power = "N/A" if g.get("power_w") is None else f"{g['power_w']:.0f}W {pct(g.get('power_pct'))}"
                rows.append(_row([
                    (f"  gpu {g['index']}", "cyan"), (str(g.get("name") or ""), "dim"), ("", ""), ("", ""),
                    (",".join(str(p) for p in g.get("pids") or []), ""),
                    (pct(g.get("util_pct")), "bold yellow" if {"gpu_util", "busy_low_power"} & set(kinds) else ""),
                    (power, "bold yellow" if {"gpu_power", "busy_low_power"} & set(kinds) else ""),
                    (f"{size(g.get('mem_used_bytes'))}/{size(g.get('mem_total_bytes'))}", ""),
                    ("N/A" if g.get("temp_c") is None else f"{g['temp_c']}C", ""), ("", ""), ("", ""),
                    (" ".join([*words, *badges]), "bold yellow" if kinds else "yellow"),
                ], dim))
        if ranks:
            for r in sorted(node["ranks"], key=lambda r: (r["rank"] is None, r["rank"] or 0, r["pid"])):
                kinds = marks.get((node["target"], "rank", r["pid"]), [])
                prog = r.get("progress") or {}
                rstate = str(r.get("state"))
                rows.append(_row([
                    (f"  {r['label']}", "cyan"),
                    (f"pid {r['pid']} {rstate}", "bold red" if rstate in ("D", "T", "Z") else ""),
                    (pct(r.get("cpu_pct")), "bold yellow" if "rank_cpu" in kinds else ""),
                    (size(r.get("rss_bytes")), ""), (f"{r.get('threads') or ''} thr", ""),
                    ("gpu " + ",".join(map(str, r["gpu"])) if r.get("gpu") else "", ""), ("", ""), ("", ""),
                    ("", ""), ("" if prog.get("step") is None else str(prog["step"]), ""),
                    (num(prog.get("rate")), "bold yellow" if "step_rate" in kinds else ""),
                    (" ".join(KIND_WORDS.get(k, k) for k in kinds), "bold yellow"),
                ], dim))
    return rows


def render_rows(rows: list[Row], *, color: bool = True, window: tuple[int, int] | None = None) -> Text:
    """Fixed-width lines (a rich Table costs ~2 ms a row; this, a few µs): header, rule, rows."""
    from rich.text import Text

    widths = [len(c) for c in COLUMNS]
    for row in rows:
        for i, cell in enumerate(row.cells):
            if len(cell) > widths[i]:
                widths[i] = len(cell)

    def line(cells: list[str]) -> list[str]:
        return [c.ljust(widths[i]) if i in LEFT else c.rjust(widths[i]) for i, c in enumerate(cells)]

    out = Text(no_wrap=True, overflow="ellipsis")
    out.append("  ".join(line(list(COLUMNS))).rstrip() + "\n", style="bold" if color else "")
    out.append("-" * (sum(widths) + 2 * (len(widths) - 1)) + "\n", style="dim" if color else "")
    shown = rows if window is None else rows[window[0]:window[1]]
    for row in shown:
        start = len(out)
        padded = line(row.cells)
        for i, cell in enumerate(padded):
            if i:
                out.append("  ")
            out.append(cell, style=row.styles[i] if color and row.styles[i] else "")
        out.rstrip()
        if color and row.style:
            out.stylize(row.style, start, len(out))
        out.append("\n")
    out.rstrip()
    return out


def build_table(result: dict[str, Any], *, gpus: bool, ranks: bool, sort: str = "node",
                selected: str | None = None, color: bool = True) -> Text:
    """The whole snapshot as one table (plain output and --once)."""
    return render_rows(table_rows(result, gpus=gpus, ranks=ranks, sort=sort, selected=selected), color=color)


def outlier_lines(result: dict[str, Any], limit: int = MAX_OUTLIER_LINES) -> list[str]:
    lines = [f"! {o['message']}" for o in result["outliers"][:limit]]
    if len(result["outliers"]) > limit:
        lines.append(f"  ... and {len(result['outliers']) - limit} more (--json lists them all)")
    for n in result["nodes"]:
        if n["status"] != "ok":
            lines.append(f"x {n['target']}: {n['status']}" + (f": {n['error']}" if n["error"] else ""))
        elif n.get("note"):
            lines.append(f"~ {n['note']}")
        lines += [f"~ {n['target']}: {note}" for note in (n.get("notes") or [])[:2]]  # e.g. a --user no node has
    return lines + progress_notes(result)


def progress_notes(result: dict[str, Any]) -> list[str]:
    """One line per --progress-file pattern that names a file that is not there or cannot be read (its
    first error, and the ranks, or the nodes, it concerns): one pattern wrong for 64 ranks is one line."""
    live = [n for n in result["nodes"] if n["status"] == "ok"]
    bad: dict[str, tuple[str, set[int], set[str]]] = {}  # pattern -> (first error, ranks, nodes)
    for n in live:
        files = [(r["rank"], r["progress"]) for r in n["ranks"] if r.get("progress")]
        files += [(f.get("rank"), f) for f in n["progress"]]
        for rank, f in files:
            if f.get("error"):
                _, ranks, nodes = bad.setdefault(f.get("pattern") or f["path"], (f["error"], set(), set()))
                nodes.add(n["target"])
                if rank is not None:
                    ranks.add(rank)
    return [f"~ progress file {pattern}: {error}{_where(ranks, nodes, len(live))}"
            for pattern, (error, ranks, nodes) in bad.items()]


def _where(ranks: set[int], nodes: set[str], live: int) -> str:
    """`` (ranks 0-3)``; for files of no rank, `` (on n2)`` when not every answering node has the problem."""
    if ranks:
        return f" (rank{'s' if len(ranks) > 1 else ''} {compress(ranks)})"
    if len(nodes) < live:
        names = sorted(nodes, key=_natural)
        return f" (on {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
    return ""


def header(result: dict[str, Any], sort: str) -> str:
    c = result["counts"]
    times = [n["sampled_at"] for n in result["nodes"] if n.get("sampled_at")]
    when = time.strftime("%H:%M:%S", time.localtime(max(times))) if times else "--:--:--"
    where = result["transport"] + (f" job {result['slurm_job']}" if result.get("slurm_job") else "")
    return (f"mldebug top · {where} · {c['answering']}/{c['nodes']} nodes answering · {c['ranks']} ranks · "
            f"{c['gpus']} GPUs · every {result['interval_s']:g}s · sort {sort} · last sample {when}")


def print_snapshot(console: Console, result: dict[str, Any], *, gpus: bool, ranks: bool, sort: str) -> None:
    """The plain-text view (stdout not a terminal, or --once without --json)."""
    console.print(header(result, sort), highlight=False)
    console.print(build_table(result, gpus=gpus, ranks=ranks, sort=sort, color=console.is_terminal))
    for line in outlier_lines(result):
        console.print(line, highlight=False, markup=False)
    console.print(result["summary"], highlight=False, markup=False)


# ------------------------------------------------------------------------------- the live view


class LiveView:
    """Full screen, redrawn every second; keys change what is shown. Ctrl-C restores the terminal."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]], *, interval: float, gpus: bool, ranks: bool,
                 sort: str, dump: Callable[[str], dict[str, Any]] | None = None) -> None:
        self.snapshot = snapshot
        self.interval = interval
        self.gpus, self.ranks = gpus, ranks
        self.sort = sort
        self.dump = dump
        self.selected: str | None = None
        self.order: list[str] = []
        self.dump_text: str | None = None
        self._dump_thread: threading.Thread | None = None

    # -- keys ------------------------------------------------------------------------------------
    def key(self, k: str) -> bool:
        """Act on one key; False means quit."""
        if k in ("q", "Q"):
            return False
        if k == "g":
            self.gpus = not self.gpus
        elif k == "r":
            self.ranks = not self.ranks
        elif k == "s":
            self.sort = SORT_KEYS[(SORT_KEYS.index(self.sort) + 1) % len(SORT_KEYS)]
        elif k in ("j", "\x1b[B", "k", "\x1b[A") and self.order:
            i = self.order.index(self.selected) if self.selected in self.order else -1
            step = 1 if k in ("j", "\x1b[B") else -1
            self.selected = self.order[(i + step) % len(self.order)] if i >= 0 else self.order[0]
        elif k == "d":
            self.start_dump()
        return True

    def start_dump(self) -> None:
        node = self.selected or (self.order[0] if self.order else None)
        if node is None:
            return
        if self.dump is None:
            self.dump_text = "dump-stacks is not available here"
            return
        if self._dump_thread is not None and self._dump_thread.is_alive():
            return
        self.selected = node
        self.dump_text = f"dump-stacks {node}: running (py-spy on its ranks) ..."
        dump = self.dump

        def work() -> None:
            try:
                r = dump(node)
                verdict = r.get("verdict") or r.get("summary") or "no verdict"
                self.dump_text = f"dump-stacks {node}: {verdict}"
            except Exception as e:  # shown in the view, never a crash of the view
                self.dump_text = f"dump-stacks {node} failed: {getattr(e, 'message', None) or e}"

        self._dump_thread = threading.Thread(target=work, name="mldebug-top-dump", daemon=True)
        self._dump_thread.start()

    # -- drawing ---------------------------------------------------------------------------------
    def render(self, result: dict[str, Any], height: int | None = None) -> RenderableType:
        """The screen: header, the table (only the rows that fit, around the selected node), what stands
        out, the dump-stacks verdict, the keys."""
        from rich.console import Group
        from rich.text import Text

        rows = table_rows(result, gpus=self.gpus, ranks=self.ranks, sort=self.sort, selected=self.selected)
        self.order = [r.node for r in rows if r.node is not None]
        if self.selected not in self.order:
            self.selected = self.order[0] if self.order else None
            rows = table_rows(result, gpus=self.gpus, ranks=self.ranks, sort=self.sort, selected=self.selected)
        notes = [Text(line, style="yellow" if line.startswith("!") else "red" if line.startswith("x") else "dim")
                 for line in outlier_lines(result)]
        if not result["outliers"] and not result["not_answering"]:
            notes.append(Text("nothing stands out", style="green"))
        if self.dump_text:
            notes.append(Text(self.dump_text, style="bold cyan"))
        title = header(result, self.sort)
        window = None
        if height is not None:
            room = max(3, height - 4 - len(notes))  # header, table head (2), keys
            if len(rows) > room:
                at = next((i for i, r in enumerate(rows) if r.node == self.selected), 0)
                first = max(0, min(at - room // 3, len(rows) - room))
                window = (first, first + room)
                title += f" · rows {first + 1}-{first + room} of {len(rows)} (j/k)"
        parts: list[Any] = [Text(title, style="bold"), render_rows(rows, window=window), *notes,
                            Text(KEYS_HELP, style="dim")]
        return Group(*parts)

    def run(self, console: Console, stdin_fd: int | None = None) -> int:
        """Until q (exit 0) or Ctrl-C (KeyboardInterrupt, after the terminal is restored)."""
        import termios
        import tty

        from rich.live import Live

        fd = sys.stdin.fileno() if stdin_fd is None else stdin_fd
        saved = termios.tcgetattr(fd)
        period = min(self.interval, 1.0)
        try:
            tty.setcbreak(fd)  # keys arrive one by one; Ctrl-C still raises KeyboardInterrupt
            with Live(console=console, screen=True, auto_refresh=False, redirect_stdout=False,
                      redirect_stderr=False) as live:
                next_draw = 0.0
                while True:
                    now = time.monotonic()
                    if now >= next_draw:
                        live.update(self.render(self.snapshot(), console.size.height), refresh=True)
                        # draw just after the samples of the next wall-clock tick have arrived
                        wall = time.time()
                        next_draw = now + (period - wall % period) + min(0.25, period / 4)
                    ready, _, _ = select.select([fd], [], [], max(0.0, next_draw - time.monotonic()))
                    if ready:
                        data = os.read(fd, 64).decode(errors="replace")
                        for k in _keys(data):
                            if not self.key(k):
                                return 0
                        next_draw = 0.0
        finally:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _keys(data: str) -> list[str]:
    """Split what one read returned into keys (arrow keys are three-character sequences)."""
    out: list[str] = []
    i = 0
    while i < len(data):
        if data[i] == "\x1b" and data[i + 1:i + 2] == "[" and i + 2 < len(data):
            out.append(data[i:i + 3])
            i += 3
        else:
            out.append(data[i])
            i += 1
    return out
