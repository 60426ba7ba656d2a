"""Helpers every CLI area shares: one console, JSON output, and exiting with a reason."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

from rich.console import Console

console = Console()
"""Tables, notes and progress for people; `main()` points it at stderr for a command line with `--json`, so
stdout then holds the JSON document alone."""
err_console = Console(stderr=True)


EXIT_RUNTIME = 1
"""The command was well formed but failed while running: no Ray cluster, a controller that did not answer,
replicas not ready, an unreachable server or Kubernetes API, no recipes installed (docs/cli.md)."""
EXIT_USAGE = 2
"""The command line or a file it names is wrong: a bad flag value, an unknown model or variant, an invalid
recipe, options that do not go together. Click's own usage errors exit 2 as well."""


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print `message` to stderr and exit with `code` (EXIT_USAGE unless the failure happened at run time)."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise SystemExit(code)


def print_json(obj: Any) -> None:
    """`obj` as JSON on stdout, written directly: rich's console would wrap long lines at the terminal width
    and break the document for a reader such as `jq`."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def parse_service_classes(items: list[str], flag: str) -> list:
    """`NAME:TTFT_S:ITL_S` values of `flag` as service classes (a bad one exits with the reason). `zoe deploy
    --switch-class` and `zoe router --slo-class` take the same form."""
    from pydantic import ValidationError

    from zoe_cluster.switching.vocabulary import ServiceClass

    out = []
    for item in items:
        parts = item.split(":")
        if len(parts) != 3:
            fail(f"{flag} expects NAME:TTFT_S:ITL_S (e.g. interactive:1:0.020), got {item!r}")
        try:
            out.append(ServiceClass(name=parts[0], ttft_s=float(parts[1]), itl_s=float(parts[2])))
        except (ValueError, ValidationError) as e:
            fail(f"{flag} {item!r}: {e}")
    return out
