"""How a pydantic validation error reads in zoe's messages: every problem as `dotted.field: message`, joined by "; ".

Recipes name their problems by file and field through `zoe_cluster.recipes.loader` (which also drops the engine
union's tag from the path); every other typed input (router config, membership, policy tunables, deployment flags)
reads as `validation_problems` writes it.
"""

from __future__ import annotations

from pydantic import ValidationError


def validation_problems(error: ValidationError, whole: str = "", prefix: str = "") -> str:
    """`error`'s problems, each `prefix` + `dotted.field: message`; `whole` stands for a problem of the whole input
    (an empty field path)."""
    return "; ".join(f"{prefix}{'.'.join(str(p) for p in err['loc']) or whole}: {err['msg']}" for err in error.errors())
