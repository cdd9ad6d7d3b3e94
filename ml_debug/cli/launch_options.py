"""Option aliases for every command that runs ranks (gpu-test, allreduce-bench, train).

They spell torchrun's own options exactly (an exact match is passed through to the worker by
torchrun, while a worker option that is only a *prefix* of a torchrun option makes torchrun fail
with "ambiguous option": FIELD-NOTES), so the same words work with and without torchrun.
"""

from __future__ import annotations

from typing import Annotated

import typer

NprocPerNode = Annotated[
    int | None,
    typer.Option("--nproc-per-node", min=1, envvar="MLDEBUG_NPROC_PER_NODE",
                 help="Self-launch this many local ranks (default: one per visible GPU, or 2 CPU ranks). "
                      "Ignored when torchrun, srun or mpirun already launched us. [env: MLDEBUG_NPROC_PER_NODE]"),
]
Nnodes = Annotated[
    int,
    typer.Option("--nnodes", min=1, help="Nodes in a self-launched multi-node run (run the same command "
                 "on each node with its --node-rank)."),
]
NodeRank = Annotated[
    int,
    typer.Option("--node-rank", min=0, help="This node's rank in a self-launched multi-node run (0 .. nnodes-1)."),
]
MasterAddr = Annotated[
    str | None,
    typer.Option("--master-addr", help="Host of node rank 0 (needed with --nnodes > 1)."),
]
MasterPort = Annotated[
    int | None,
    typer.Option("--master-port", min=1, max=65535,
                 help="Rendezvous port on the master (default: a free port on one node, 29500 across nodes)."),
]
Backend = Annotated[
    str,
    typer.Option("--backend", envvar="MLDEBUG_BACKEND",
                 help="Process-group backend: auto (nccl with a GPU, else gloo), nccl or gloo. "
                      "[env: MLDEBUG_BACKEND]"),
]
Device = Annotated[
    str,
    typer.Option("--device", envvar="MLDEBUG_DEVICE",
                 help="auto (cuda:<local rank> with a GPU, else cpu), cpu, cuda or cuda:N. [env: MLDEBUG_DEVICE]"),
]


def launch_args(nnodes: int, node_rank: int, master_addr: str | None, master_port: int | None) -> list[str]:
    """The multi-node options as argv words (for commands that re-run themselves elsewhere)."""
    args = ["--nnodes", str(nnodes), "--node-rank", str(node_rank)]
    if master_addr:
        args += ["--master-addr", master_addr]
    if master_port:
        args += ["--master-port", str(master_port)]
    return args
