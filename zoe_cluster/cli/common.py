"""Helpers every CLI area shares: one console, JSON output, and exiting with a reason."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

from rich.console import Console

console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `message` to stderr and exit non-zero."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise SystemExit(code)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
