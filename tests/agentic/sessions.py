"""Small session files for the agentic tests: real samples (data/) and hand-built ones with known timing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"


def req(n_in: int, out: int, ids: list[int], think: float = 0.0, t: float = 0.0, kind: str = "n") -> dict[str, Any]:
    return {"t": t, "type": kind, "in": n_in, "out": out, "hash_ids": ids, "think_time": think}


def sub(agent_id: str, *requests: dict[str, Any]) -> dict[str, Any]:
    return {"t": 0.0, "type": "subagent", "agent_id": agent_id, "requests": list(requests)}


def write_session(path: Path, requests: list[dict[str, Any]], block_size: int = 64, sid: str | None = None,
                  scope: str = "local") -> Path:
    doc = {"id": sid or path.stem, "block_size": block_size, "hash_id_scope": scope, "tool_tokens": 0,
           "system_tokens": 0, "requests": requests}
    path.write_text(json.dumps(doc))
    return path
