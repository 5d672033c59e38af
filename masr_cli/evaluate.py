"""`masr evaluate` (placeholder until its issue lands)."""

from __future__ import annotations

import typer

NAME = "evaluate"


def command() -> None:
    """Not implemented yet."""
    raise typer.Exit(2)
