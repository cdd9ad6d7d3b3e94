"""Option aliases shared by many commands (one definition, one help text)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Json = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON document (stable, versioned schema) instead of tables. "
                 "Same as the global --json. [env: MLDEBUG_JSON]"),
]
OutDir = Annotated[
    Path | None,
    typer.Option("--out-dir", help="Also write results here as they arrive, so nothing is lost on "
                 "Ctrl-C or a crash.", file_okay=False),
]
Timeout = Annotated[
    float,
    typer.Option("--timeout", min=0.1, help="Seconds before giving up on one step (nothing waits forever)."),
]


def use_json(flag: bool) -> bool:
    """Combine a command's own --json with the global one; returns the effective mode."""
    from ml_debug.core import output

    if flag:
        output.configure(json=True)
    return output.MODE.json
