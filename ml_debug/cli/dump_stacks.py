"""CLI command module (placeholder: registers nothing yet)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    pass
