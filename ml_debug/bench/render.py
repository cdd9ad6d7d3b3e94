"""Human tables (nccl-tests-like) and CSV for an allreduce-bench result."""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING, Any

from ml_debug.bench import bandwidth as bw
from ml_debug.bench.sweep import BenchResult

if TYPE_CHECKING:
    from rich.console import Console

SWEEP_COLUMNS = ("collective", "size", "count", "type", "redop", "root", "time_us", "algbw_gbps", "busbw_gbps",
                 "wrong", "slowest_rank", "max_time_us", "spread", "straggler")
PAIR_COLUMNS = ("unit_a", "unit_b", "name_a", "name_b", "busbw_gbps", "vs_median", "slow")


def to_csv(res: BenchResult) -> str:
    """One row per (collective, size), or per unit pair in --pairwise mode."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    if res.pairwise is not None:
        p = res.pairwise
        slow = {(link.a, link.b) for link in p.slow_links}
        w.writerow(PAIR_COLUMNS)
        for a in range(len(p.names)):
            for b in range(a + 1, len(p.names)):
                v = p.matrix[a][b]
                w.writerow([a, b, p.names[a], p.names[b], _num(v), _num(v / p.median if v and p.median else None),
                            int((a, b) in slow)])
        return buf.getvalue()
    w.writerow(SWEEP_COLUMNS)
    for c in res.collectives:
        for s in c.sizes:
            w.writerow([c.collective, s.size, s.count, s.dtype, s.op or "none", "" if s.root is None else s.root,
                        _num(s.time_us), _num(s.algbw), _num(s.busbw), "" if s.wrong is None else s.wrong,
                        s.slowest_rank, _num(s.max_time_us), _num(s.spread),
                        "" if s.straggler is None else s.straggler])
    return buf.getvalue()


def _num(v: float | None) -> str:
    return "" if v is None else f"{v:.6g}"


def _fmt_bw(v: float) -> str:
    return f"{v:.2f}" if v >= 0.1 else f"{v:.4f}"


def render(res: BenchResult, env: dict[str, Any], console: Console) -> None:
    """Draw the nccl-tests-like table(s), legend, footer and environment block."""
    from rich.table import Table

    ranks = res.ranks
    hosts = sorted({r.host for r in ranks})
    console.print(f"# mldebug allreduce-bench: {res.world_size} ranks on {res.nnodes} node(s) "
                  f"({', '.join(hosts[:4])}{' ...' if len(hosts) > 4 else ''}), {res.device}/{res.backend}, "
                  f"torch {env.get('torch')}, python {env.get('python')}")
    console.print(f"# dtype {res.dtype}, {res.iters} iters + {res.warmup} warmup per size, "
                  f"time averaged across ranks: {res.average}")
    for note in res.notes:
        console.print(f"# note: {note}")
    if res.pairwise is not None:
        _render_pairwise(res, console)
    for c in res.collectives:
        console.print()
        if c.error:
            console.print(f"# {c.collective}: FAILED: {c.error}")
            continue
        t = Table(title=f"{c.collective} (busbw = algbw x {c.bus_factor:.4g})", title_justify="left",
                  box=None, pad_edge=False, header_style="bold")
        for name in ("size(B)", "count", "type", "redop", "root", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
                     "#wrong", "slowest", "spread"):
            t.add_column(name, justify="right")
        for s in c.sizes:
            slow = f"{s.slowest_rank}" + ("*" if s.straggler is not None else "")
            wrong = "N/A" if s.wrong is None else str(s.wrong)
            if s.wrong_by_rank:
                wrong += " (" + ",".join(f"r{r}:{k}" for r, k in sorted(s.wrong_by_rank.items())) + ")"
            t.add_row(str(s.size), str(s.count), s.dtype, s.op or "none", "-" if s.root is None else str(s.root),
                      f"{s.time_us:.1f}", _fmt_bw(s.algbw), _fmt_bw(s.busbw), wrong, slow, f"{s.spread:.0%}")
        console.print(t)
        console.print(f"# Out of bounds values : {c.wrong_total} {'OK' if not c.wrong_total else 'FAILED'}")
        console.print(f"# Avg bus bandwidth    : {c.avg_busbw_large:.3f} GB/s (sizes >= {bw.format_size(c.large_from)})")
        console.print(f"# Peak bus bandwidth   : {c.peak_busbw:.3f} GB/s at {bw.format_size(c.peak_size)}")
        if c.straggler:
            s2 = c.straggler
            console.print(f"# Straggler            : rank {s2.rank} on {s2.host}, {s2.times_slower:.1f}x the "
                          f"others in {s2.sizes_flagged}/{s2.sizes_total} large sizes")
        if c.expect_ok is not None:
            console.print(f"# Expected busbw       : >= {res.expect_busbw:g} GB/s: {'PASS' if c.expect_ok else 'FAIL'}")
    if res.collectives:
        console.print()
        console.print("# size in bytes; time(us): mean per operation over --iters on each rank, combined by --average")
        console.print("# algbw = size / time (GB/s = 1e9 bytes/s); busbw = algbw x bus factor, comparable with link speed:")
        console.print("#   all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce, sendrecv 1")
        console.print("# slowest: rank with the longest own time (* = straggler at that size); spread = (slowest-fastest)/fastest")
    console.print(res.summary)


def _render_pairwise(res: BenchResult, console: Console) -> None:
    from rich.table import Table

    p = res.pairwise
    assert p is not None
    console.print(f"# pairwise: {len(p.names)} {p.units}s, {bw.format_size(p.size)} exchanged both ways per "
                  f"pair, {p.rounds} round(s) of disjoint pairs, best of {p.passes} passes; GB/s per direction")
    t = Table(box=None, pad_edge=False, header_style="bold")
    t.add_column("")
    for i in range(len(p.names)):
        t.add_column(str(i), justify="right")
    slow = {(link.a, link.b) for link in p.slow_links}
    for a, name in enumerate(p.names):
        cells = []
        for b in range(len(p.names)):
            v = p.matrix[a][b]
            text = "-" if v is None else _fmt_bw(v)
            if (min(a, b), max(a, b)) in slow:
                text += "!"
            cells.append(text)
        t.add_row(f"{a} {name}", *cells)
    console.print(t)
    console.print(f"# median link {p.median:.3f} GB/s; '!' marks links more than {p.threshold:.0%} below the median of "
                  "the other links that stayed there when measured again")
    for r in p.remeasured:
        figures = ", ".join(f"{v:.3f}" for v in r.again)
        console.print(f"# re-measured: {r.name_a} <-> {r.name_b}: {r.first:.3f} GB/s, "
                      f"then {figures}: " + ("still slow" if r.slow else "cleared (a transient)"))
    for link in p.slow_links:
        console.print(f"# slow link: {link.name_a} <-> {link.name_b}: {link.busbw:.3f} GB/s "
                      f"({link.vs_others:.0%} of the other links' median)")
    for unit in p.slow_units:
        console.print(f"# slow {p.units}: {unit}")
