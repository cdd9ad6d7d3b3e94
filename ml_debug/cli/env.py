"""`mldebug env`: what is installed and set on this node, in one report."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from ml_debug.core.env_options import EnvOptions

if TYPE_CHECKING:
    from rich.console import Console

    from ml_debug.core.environment import EnvReport

SCHEMA = "mldebug.env"


HELP = """What is installed and set on this node: versions, GPUs (NVML), launcher variables,
NCCL/TORCH/CUDA settings (with warnings for dangerous ones), network interfaces, tools, and whether
this user may attach to other processes (ptrace).

Exit codes: 0 always (the report is the result); 2 bad options."""

EXAMPLES = (
    "mldebug env",
    "mldebug env --no-torch            # faster: skip importing torch",
    "mldebug exec --hosts node[01-04] -- mldebug env --json",
)


def env_command(opts: EnvOptions) -> int:
    from ml_debug.core import output
    from ml_debug.core.environment import collect, summary

    report = collect(include_torch=not opts.no_torch)
    output.emit(SCHEMA, 1, report, lambda console: render(console, report), environment=summary())
    return 0


def render(console: Console, r: EnvReport) -> None:
    from rich.table import Table

    def table(title: str, *columns: str) -> Table:
        t = Table(title=title, title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
        for c in columns:
            t.add_column(c, overflow="fold")
        return t

    console.print(f"[bold]{r.summary}[/bold]")
    versions = table("Versions", "component", "version")
    versions.add_row("python", f"{r.python['version']} ({r.python['executable']})")
    versions.add_row("mldebug", r.mldebug)
    t = r.torch
    versions.add_row("torch", t.version or "not installed")
    versions.add_row("CUDA (torch build)", t.cuda or (t.error or "none (CPU build)"))
    versions.add_row("NCCL", t.nccl or "n/a")
    versions.add_row("cuDNN", t.cudnn or "n/a")
    counted = f"{t.device_count}" + (f"; arch list {' '.join(t.arch_list)}" if t.arch_list else "")
    # no torch imported (--no-torch, missing, broken): no count, rather than a 0 that reads as "no GPU"
    versions.add_row("CUDA devices (torch)", t.error if t.error and not t.cuda else counted)
    console.print(versions)

    gpus = r.gpus.get("gpus", [])
    if gpus:
        fake = str(r.gpus.get("nvml_source") or "").startswith("fake:")
        g = table("GPUs (FAKE NVML: test data, not this node's hardware)" if fake else "GPUs (NVML)",
                  "index", "name", "uuid", "bus id", "driver", "memory")
        for gpu in gpus:
            g.add_row(*(str(gpu.get(k, "N/A")) for k in ("index", "name", "uuid", "bus_id", "driver", "memory")))
        console.print(g)
    else:
        console.print(f"[bold]GPUs[/bold]: {r.gpus.get('reason') or 'no NVIDIA GPU/driver'}")

    for title, values, empty in (
        ("Launcher / world variables", r.world, "none set (not started by torchrun, srun or mpirun)"),
        ("NCCL_* / TORCH_* / CUDA_* settings", r.settings, "none set"),
    ):
        if values:
            v = table(title, "variable", "value")
            for key, value in values.items():
                v.add_row(key, repr(value) if value.strip() == "" else value)
            console.print(v)
        else:
            console.print(f"[bold]{title}[/bold]: {empty}")

    nics = table("Network interfaces", "name", "state", "mtu", "speed", "addresses")
    for n in r.interfaces:
        nics.add_row(n.name, "up" if n.up else "down", str(n.mtu or ""),
                     f"{n.speed_mbps} Mb/s" if n.speed_mbps else "", " ".join(n.addresses))
    console.print(nics)

    tools = table("Tools", "tool", "path", "version")
    for tool in r.tools:
        tools.add_row(tool.name, tool.path or "[red]not found[/red]", tool.version or "")
    console.print(tools)

    p = r.ptrace
    console.print(f"[bold]ptrace[/bold]: {p.explanation}" + (f"\n  fix: {p.fix}" if p.fix else ""))
    for w in r.warnings:
        console.print(f"[yellow]warning[/yellow]: {w}")


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "env", env_command, help=HELP, examples=EXAMPLES, opts=EnvOptions)
