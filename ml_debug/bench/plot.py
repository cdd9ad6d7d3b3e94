"""PNG plots for allreduce-bench: busbw vs size (log x) and the pairwise heatmap.

matplotlib is an optional extra (``pip install 'mldebug[plot]'``); it is drawn with the Agg
backend so no display is needed. Each function returns what it drew on the axes, so callers and
tests can check the axes without parsing the image.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ml_debug.bench import bandwidth as bw
from ml_debug.core.extras import require


@dataclass
class PlotInfo:
    path: str
    kind: str  # "curve" or "heatmap"
    title: str
    xlabel: str
    ylabel: str
    xscale: str
    series: list[str]
    note: str | None = None  # a link planted at the name, replaced (safefs.write_file)


def _save(fig: Any, path: str | Path) -> str | None:
    """The PNG drawn in memory, then written by safefs: a link planted at the name is replaced, never
    written through (matplotlib would open the name and follow it)."""
    import io

    from ml_debug.core import safefs

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return safefs.write_file("--plot", path, buf.getvalue())


def require_matplotlib() -> None:
    """Fail early (exit 3) with the install hint when matplotlib is missing."""
    require("matplotlib", "allreduce-bench --plot")


def _pyplot() -> Any:
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_curve(result: Any, path: str | Path) -> PlotInfo:
    """busbw (GB/s) vs message size (log2 x axis), one line per collective."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    series = []
    try:
        for c in result.collectives:
            if not c.sizes:
                continue
            ax.plot([s.size for s in c.sizes], [s.busbw for s in c.sizes], marker="o", label=c.collective)
            series.append(c.collective)
        if result.expect_busbw is not None:
            ax.axhline(result.expect_busbw, linestyle="--", color="red", label=f"expected {result.expect_busbw:g}")
        ax.set_xscale("log", base=2)
        ticks = sorted({s.size for c in result.collectives for s in c.sizes})
        if ticks:
            step = max(1, len(ticks) // 10)
            ax.set_xticks(ticks[::step])
            ax.set_xticklabels([bw.format_size(t) for t in ticks[::step]], rotation=45)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        title = f"mldebug allreduce-bench: {result.world_size} ranks, {result.device}/{result.backend}, {result.dtype}"
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if series:
            ax.legend()
        fig.tight_layout()
        note = _save(fig, path)
        return PlotInfo(str(path), "curve", title, ax.get_xlabel(), ax.get_ylabel(), ax.get_xscale(), series, note)
    finally:
        plt.close(fig)


def plot_heatmap(result: Any, path: str | Path) -> PlotInfo:
    """The pairwise bandwidth matrix as a heatmap; slow links are outlined."""
    import math

    plt = _pyplot()
    p = result.pairwise
    m = len(p.names)
    data = [[math.nan if v is None else v for v in row] for row in p.matrix]
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * m + 3), max(4, 0.6 * m + 2)), dpi=100)
    try:
        im = ax.imshow(data, cmap="viridis", interpolation="nearest")
        fig.colorbar(im, ax=ax, label="GB/s per direction")
        ax.set_xticks(range(m))
        ax.set_yticks(range(m))
        labels = [str(i) for i in range(m)] if m > 16 else p.names
        ax.set_xticklabels(labels, rotation=90)
        ax.set_yticklabels(labels)
        for link in p.slow_links:
            for a, b in ((link.a, link.b), (link.b, link.a)):
                ax.add_patch(plt.Rectangle((b - 0.5, a - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
        ax.set_xlabel(p.units)
        ax.set_ylabel(p.units)
        if m <= 16:  # small matrices: print the numbers in the cells too
            for a in range(m):
                for b in range(m):
                    if not math.isnan(data[a][b]):
                        ax.text(b, a, f"{data[a][b]:.3g}", ha="center", va="center", fontsize=8, color="white")
        title = f"pairwise bandwidth, {bw.format_size(p.size)} per exchange\n(median {p.median:.3g} GB/s)"
        ax.set_title(title, fontsize=10)
        fig.tight_layout()
        note = _save(fig, path)
        return PlotInfo(str(path), "heatmap", title, ax.get_xlabel(), ax.get_ylabel(), ax.get_xscale(), p.names,
                        note)
    finally:
        plt.close(fig)


def plot(result: Any, path: str | Path) -> PlotInfo:
    """The curve for a sweep, the heatmap for --pairwise."""
    return plot_heatmap(result, path) if result.pairwise is not None else plot_curve(result, path)
