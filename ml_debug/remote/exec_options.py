"""The options of `mldebug exec` (cheap to import: the CLI builds its options from them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ml_debug.core.options import argument, option, parse_out_dir


@dataclass(frozen=True)
class ExecOptions:
    """The options of `mldebug exec`."""

    command: list[str] = argument(default_factory=list, metavar="CMD...", empty=True, help="The command and its arguments.")
    timeout: float = option(60.0, flags=("--node-timeout",), renamed_from=("--timeout",), min=0.1, metavar="S",
                            help="Seconds the command may run on each node.")
    group: bool = option(False, flags=("--group",), renamed_from=("-g",),
                         help="Group nodes with identical output (like dshbak -c) instead of printing lines as they "
                              "arrive.")
    out_dir: Path | None = option(None, metavar="DIR", parse=parse_out_dir,
                                  help="Also write each node's output here as it arrives.")
