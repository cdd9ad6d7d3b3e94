"""What `mldebug tflops` prints."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from ml_debug.tflops.result import TflopsReport


def _pct(x: float | None) -> str:
    return "n/a (no known peak: --gpu-model NAME)" if x is None else f"{x:.1%}"


def render(console: Console, r: TflopsReport) -> None:
    from rich.table import Table

    console.print(f"[bold]{r.summary}[/bold]")
    t = Table(show_header=False, show_edge=False, pad_edge=False, box=None)
    t.add_column("what", style="bold")
    t.add_column("value", overflow="fold")
    t.add_row("model TFLOP/s per GPU", f"{r.model_tflops:.1f}")
    t.add_row("hardware TFLOP/s per GPU", f"{r.hardware_tflops:.1f}" + (" (recomputation counted)" if r.recompute
                                                                         else " (= model: no recomputation)"))
    peak = "unknown" if r.peak_tflops is None else f"{r.peak_tflops:g} TFLOP/s dense {r.peak_kind}"
    t.add_row("peak", f"{peak} ({r.gpu if r.gpu else 'no GPU named or found'})")
    t.add_row("MFU", _pct(r.mfu))
    t.add_row("HFU", _pct(r.hfu))
    t.add_row("tokens/s per GPU", f"{r.tokens_per_s_per_gpu:,.0f}")
    shape = f"{r.params / 1e9:.3g}B parameters ({r.params_source})"
    if r.layers and r.hidden:
        shape += f", {r.layers} layers x {r.hidden} wide, vocabulary {r.vocab}"
    t.add_row("model", shape)
    t.add_row("iteration", f"{r.tokens_per_iteration:,.0f} tokens in {r.iteration_s:.4g} s on {r.gpus} GPU(s) "
                           f"({r.iteration_source})")
    t.add_row("formula", r.formula)
    for i, line in enumerate(r.arithmetic):
        t.add_row("" if i else "arithmetic", line)
    console.print(t)
    for note in r.notes:
        console.print(f"note: {note}")
