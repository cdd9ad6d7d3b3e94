"""Options every command that runs ranks shares: where the ranks run (launch) and on what (device).

The launch options spell torchrun's own (an exact match is passed through to the worker by torchrun,
while a worker option that is only a *prefix* of a torchrun option makes torchrun fail with
"ambiguous option"), so the same words work with and without torchrun. They are never forwarded to
the ranks; the device options are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ml_debug.core.options import option

PANEL = "Launch"


def _nproc_per_node(default: str) -> Any:
    """The ``--nproc-per-node`` field; ``default`` says what the command does without it."""
    return option(None, min=1, metavar="N", envvar="MLDEBUG_NPROC_PER_NODE", panel=PANEL, forward=False,
                  help=f"Self-launch this many local ranks (default: {default}). "
                       "Ignored when torchrun, srun or mpirun already launched us.")


@dataclass(frozen=True)
class SpawnOptions:
    """How to self-launch ranks when no launcher (torchrun, srun, mpirun) started us."""

    nproc_per_node: int | None = _nproc_per_node("one per visible GPU, or 2 CPU ranks")
    nnodes: int = option(1, min=1, metavar="N", panel=PANEL, forward=False,
                         help="Nodes in a self-launched multi-node run (run the same command on each node "
                              "with its --node-rank).")
    node_rank: int = option(0, min=0, panel=PANEL, forward=False,
                            help="This node's rank in a self-launched multi-node run (0 .. nnodes-1).")
    master_addr: str | None = option(None, panel=PANEL, forward=False,
                                     help="Host of node rank 0 (needed with --nnodes > 1).")
    master_port: int | None = option(None, min=1, max=65535, panel=PANEL, forward=False,
                                     help="Rendezvous port on the master (default: a free port on one node, "
                                          "29500 across nodes).")
    max_nproc_per_node: int | None = option(
        None, min=1, metavar="N", envvar="MLDEBUG_MAX_NPROC_PER_NODE", panel=PANEL, forward=False,
        help="Refuse to self-launch more local ranks than this (default: what the node can run: 4 per CPU "
             "core, and no more than fit in the available memory at 0.5 GB a rank).")


@dataclass(frozen=True)
class OptInSpawnOptions(SpawnOptions):
    """The launch options of a command that runs in this one process unless asked for ranks (train)."""

    nproc_per_node: int | None = _nproc_per_node("none: one plain process, no ranks")


# ----------------------------------------------------------------------------- one rank under debugpy

DEBUG_RANK_MODULE = "ml_debug.debugger.rank"  # each rank's wrapper (named, not imported: it is a feature above)


def debug_rank_option(panel: str) -> Any:
    return option(
        None, min=0, metavar="R", panel=panel, forward=False,
        help="Run rank R under debugpy, listening on 127.0.0.1 (--debug-port) and waiting for a client; every rank's "
             "process-group timeout is raised so the others wait. Rank R prints the VS Code attach configuration "
             "and the ssh tunnel command. Needs mldebug[debug]. See docs/commands/attach.md.")


def debug_port_option(panel: str) -> Any:
    return option(5678, min=1, max=65535, metavar="PORT", panel=panel, forward=False,
                  help="With --debug-rank: debugpy's port (127.0.0.1 only).")


def debug_no_wait_option(panel: str) -> Any:
    return option(False, panel=panel, forward=False, help="With --debug-rank: start at once, attach later.")


@dataclass(frozen=True)
class DebugRankOptions:
    """One rank under debugpy (``mldebug train``; ``mldebug launch`` has the same three options)."""

    debug_rank: int | None = debug_rank_option("Debugger")
    debug_port: int = debug_port_option("Debugger")
    debug_no_wait: bool = debug_no_wait_option("Debugger")


def debug_rank_argv(rank: int, port: int, no_wait: bool, json: bool = False) -> list[str]:
    """The words before a rank's ``[-m] -- target``: ``-m ml_debug.debugger.rank --rank R --port P ...``
    (every rank runs through it; only rank R listens)."""
    return ["-m", DEBUG_RANK_MODULE, "--rank", str(rank), "--port", str(port), *(["--no-wait"] if no_wait else []),
            *(["--json"] if json else [])]


def parse_backend(word: str) -> str:
    """--backend: auto, nccl or gloo; an empty word (an unset shell variable) is refused, not read as auto."""
    from ml_debug.core.errors import UsageError

    value = word.strip().lower()
    if value not in ("auto", "nccl", "gloo"):
        raise UsageError(f"--backend {word!r} is not a backend" if value else "--backend is empty",
                         "use --backend auto, nccl or gloo")
    return value


def parse_device(word: str) -> str:
    """--device: auto, cpu, cuda or cuda:N; an empty word is refused, not read as auto."""
    from ml_debug.core.errors import UsageError

    value = word.strip().lower()
    if value not in ("auto", "cpu", "cuda") and not (value.startswith("cuda:") and value[5:].isdigit()):
        raise UsageError(f"--device {word!r} is not a device" if value else "--device is empty",
                         "use --device auto, cpu, cuda or cuda:N")
    return value


def backend_option() -> Any:
    """The ``--backend`` field of a command configuration."""
    return option("auto", envvar="MLDEBUG_BACKEND", panel=PANEL, parse=parse_backend,
                  help="Process-group backend: auto (nccl with a GPU, else gloo), nccl or gloo.")


def device_option() -> Any:
    """The ``--device`` field of a command configuration."""
    return option("auto", envvar="MLDEBUG_DEVICE", panel=PANEL, parse=parse_device,
                  help="auto (cuda:<local rank> with a GPU, else cpu), cpu, cuda or cuda:N.")
