"""The options of `mldebug logs` (cheap to import: no torch, no rich)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ml_debug.core.errors import UsageError
from ml_debug.core.options import argument, option

SHOW = "What to show"


def parse_node(word: str) -> str:
    """--node: a node's name as the logs write it (an empty one, from an unset shell variable, matches none)."""
    if not word.strip():
        raise UsageError("--node is empty", "give a node's name as the logs write it, e.g. --node node12")
    return word


@dataclass(frozen=True)
class LogsOptions:
    """The options of `mldebug logs`."""

    paths: list[str] = argument(
        default_factory=list, metavar="PATH...",
        help="Log files, directories (searched for *.log *.out *.err *.txt error*.json *.jsonl, .gz .xz .bz2 .zst .lz4 too), "
             "archives of them (.tar.gz .tgz .tar .zip ...), globs, or - for standard input.")
    rank: int | None = option(None, min=0, metavar="R", panel=SHOW,
                              help="Show only the lines rank R wrote (labels removed), in order.")
    node: str | None = option(None, metavar="NAME", panel=SHOW, parse=parse_node,
                              help="Show only the lines written on this node (with --rank: that rank there).")
    full: bool = option(False, panel=SHOW,
                        help="Show every traceback group in full and the whole timeline (shortened otherwise).")
    tracebacks: int = option(3, min=0, metavar="N", panel=SHOW,
                             help="How many distinct tracebacks to show (most important first).")
    jobs: int | None = option(None, flags=("--readers",), renamed_from=("--jobs",), min=1, metavar="N",
                              help="Reader processes (1: read everything in this process). Default: one per CPU, "
                                   "at most 16, when the logs hold over 64 MiB of text (a compressed file counted as the text it holds); "
                                   "smaller logs are read in this process.")
    html: Path | None = option(None, metavar="FILE.html", dir_okay=False, forward=False, panel=SHOW,
                               help="Also write the answer as one self-contained HTML page (the ranks' timeline per "
                                    "node, the tracebacks) to share.")
