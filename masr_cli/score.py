"""`masr score` (placeholder until its issue lands)."""

from __future__ import annotations

import typer

NAME = "score"


def command() -> None:
    """Not implemented yet."""
    raise typer.Exit(2)
