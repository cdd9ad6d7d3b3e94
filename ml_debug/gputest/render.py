"""Human view of a gpu-test verdict: one table (a row per rank, a column per stage) and a summary."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ml_debug.gputest.verdict import STAGES, GpuTestResult, stage_cell

if TYPE_CHECKING:
    from rich.console import Console

SHORT = {"device": "dev", "rendezvous": "rdzv", "all_reduce": "allreduce", "all_gather": "allgather", "broadcast": "bcast",
         "p2p_ring": "p2p"}
STYLE = {"ok": "green", "fail": "bold red", "timeout": "bold red", "absent": "bold red", "skipped": "dim"}


def render(result: GpuTestResult, console: Console) -> None:
    from rich.markup import escape
    from rich.table import Table

    v = result.versions
    if v is not None:
        console.print(f"gpu-test: {result.world_size} ranks on {len(result.hosts)} host(s), "
                      f"{result.launcher}, {result.backend}; torch {v.torch}, CUDA {v.cuda or '-'}, "
                      f"NCCL {v.nccl or '-'}; stage timeout {result.stage_timeout_s:g} s")
    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    for col in ("host", "rank", "local", "device", "uuid"):
        table.add_column(col, no_wrap=True)
    for stage in STAGES:
        table.add_column(SHORT.get(stage, stage), no_wrap=True)
    for rep in result.ranks:
        i = rep.identity
        uuid = (i.gpu_uuid[:12] + "..") if i.gpu_uuid and len(i.gpu_uuid) > 14 else (i.gpu_uuid or "-")
        cells = []
        for stage in STAGES:
            s = rep.stage(stage)
            text = stage_cell(s)
            cells.append(f"[{STYLE.get(s.status, '')}]{text}[/]" if s is not None and s.status in STYLE else text)
        table.add_row(escape(i.host), str(i.rank), str(i.local_rank) if i.local_rank >= 0 else "?", i.device, uuid,
                      *cells)
    console.print(table)
    for f in result.failures:
        console.print(f"  rank {f.rank} ({f.host}) {f.stage} {f.status.upper()}: {escape(f.detail)}", soft_wrap=True)
    for w in result.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
    mark = "[bold green]OK[/]" if result.ok else "[bold red]PROBLEM[/]"
    console.print(f"{mark} {escape(result.summary)}", soft_wrap=True)
    for h in result.hints:
        console.print(f"  hint: {escape(h)}", soft_wrap=True)
