"""`zoe` commands of this area (filled in by its module's owner)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this area's commands to the top-level app."""
