"""Agentic session traces in the kv-cache-tester format (github:callanjfox/kv-cache-tester, Apache-2.0).

One JSON file per session: `id`, `block_size` (tokens per hash id), `hash_id_scope` ("local": ids are private
to the file; "global": shared across files), `tool_tokens`, `system_tokens` and `requests`, a list whose
entries are either

- a request: `t` (seconds since the session started), `type` ("s" streaming or "n" non-streaming: how the
  recorded client called the API), `in` / `out` (prompt and output tokens), `hash_ids` (one id per *full* block
  of `block_size` prompt tokens, so `len(hash_ids) == in // block_size`; equal ids are equal blocks),
  `think_time` (client seconds between the previous response and this request) and optionally `api_time`; or
- a sub-agent, `type` "subagent": `agent_id` and its own nested `requests` (requests, or sub-agents again).
  A run of consecutive sub-agent entries was spawned together; the parent waits for all of them.

`load_sessions` validates everything the driver reads; a malformed file raises `SessionFileError` naming the
file, the request's index path (`requests[182].requests[3]`) and the field. An unknown `type` is an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REQUEST_TYPES = {"s": "streaming", "n": "non-streaming"}
"""Request `type`s of the format (how the recorded client called the API; the driver streams both)."""
SUBAGENT_TYPE = "subagent"


class SessionFileError(ValueError):
    """A session file that cannot be replayed; the message names the file, the request and the field."""


@dataclass(frozen=True, slots=True)
class AgentRequest:
    """One model call of a session."""

    index: str
    """Where it sits in the file, e.g. "requests[182].requests[3]"."""
    t_s: float
    kind: str
    """"s" or "n" (`REQUEST_TYPES`)."""
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    think_time_s: float
    """Client seconds between the previous response of this (sub-)agent and this request."""


@dataclass(frozen=True, slots=True)
class SubAgent:
    """A sub-agent the trace nests: its own conversation, spawned by its parent."""

    index: str
    agent_id: str
    items: tuple[AgentRequest | SubAgent, ...]


@dataclass(frozen=True, slots=True)
class Session:
    """One session file: the top-level agent's items in order."""

    session_id: str
    path: Path
    block_size: int
    hash_id_scope: str
    tool_tokens: int
    system_tokens: int
    items: tuple[AgentRequest | SubAgent, ...]

    def requests(self) -> list[AgentRequest]:
        """Every request of the session, sub-agents' included, in file order."""
        out: list[AgentRequest] = []

        def walk(items: tuple[AgentRequest | SubAgent, ...]) -> None:
            for it in items:
                if isinstance(it, SubAgent):
                    walk(it.items)
                else:
                    out.append(it)

        walk(self.items)
        return out


def _field(path: Path, where: str, entry: dict[str, Any], name: str, kind: type | tuple[type, ...],
           *, optional: bool = False, default: Any = None) -> Any:
    if name not in entry:
        if optional:
            return default
        raise SessionFileError(f"{path}: {where}.{name}: missing")
    value = entry[name]
    if isinstance(value, bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise SessionFileError(f"{path}: {where}.{name}: expected {names}, got {type(value).__name__} {value!r:.60}")
    return value


def _request(path: Path, where: str, entry: dict[str, Any], block_size: int) -> AgentRequest:
    n_in = _field(path, where, entry, "in", int)
    n_out = _field(path, where, entry, "out", int)
    if n_in <= 0:
        raise SessionFileError(f"{path}: {where}.in: must be positive, got {n_in}")
    if n_out < 0:
        raise SessionFileError(f"{path}: {where}.out: must be >= 0, got {n_out}")
    ids = _field(path, where, entry, "hash_ids", list)
    if not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        raise SessionFileError(f"{path}: {where}.hash_ids: every id must be an integer")
    if len(ids) != n_in // block_size:
        raise SessionFileError(f"{path}: {where}.hash_ids: {len(ids)} ids for in={n_in} tokens; the format has one "
                               f"per full block of {block_size} ({n_in // block_size})")
    think = float(_field(path, where, entry, "think_time", (int, float), optional=True, default=0.0))
    if think < 0:
        raise SessionFileError(f"{path}: {where}.think_time: must be >= 0, got {think}")
    t = float(_field(path, where, entry, "t", (int, float)))
    return AgentRequest(where, t, entry["type"], n_in, n_out, tuple(ids), think)


def _items(path: Path, where: str, entries: Any, block_size: int) -> tuple[AgentRequest | SubAgent, ...]:
    if not isinstance(entries, list):
        raise SessionFileError(f"{path}: {where}: expected a list, got {type(entries).__name__}")
    out: list[AgentRequest | SubAgent] = []
    for i, entry in enumerate(entries):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict):
            raise SessionFileError(f"{path}: {at}: expected an object, got {type(entry).__name__}")
        kind = _field(path, at, entry, "type", str)
        if kind == SUBAGENT_TYPE:
            agent_id = str(_field(path, at, entry, "agent_id", str, optional=True, default=f"sa{i}"))
            sub = _items(path, f"{at}.requests", entry.get("requests"), block_size)
            if not sub:
                raise SessionFileError(f"{path}: {at}.requests: a sub-agent needs at least one request")
            out.append(SubAgent(at, agent_id, sub))
        elif kind in REQUEST_TYPES:
            out.append(_request(path, at, entry, block_size))
        else:
            known = ", ".join(repr(k) for k in [*REQUEST_TYPES, SUBAGENT_TYPE])
            raise SessionFileError(f"{path}: {at}.type: unknown type {kind!r}; known: {known}")
    return tuple(out)


def load_session(path: str | Path) -> Session:
    """Read and validate one session file."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as e:
        raise SessionFileError(f"{p}: cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise SessionFileError(f"{p}: not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise SessionFileError(f"{p}: expected a JSON object, got {type(doc).__name__}")
    block_size = _field(p, "session", doc, "block_size", int)
    if block_size <= 0:
        raise SessionFileError(f"{p}: session.block_size: must be positive, got {block_size}")
    scope = _field(p, "session", doc, "hash_id_scope", str, optional=True, default="local")
    if scope not in ("local", "global"):
        raise SessionFileError(f"{p}: session.hash_id_scope: must be 'local' or 'global', got {scope!r}")
    items = _items(p, "requests", doc.get("requests"), block_size)
    if not items:
        raise SessionFileError(f"{p}: requests: no requests")
    return Session(
        session_id=str(doc.get("id") or p.stem), path=p, block_size=block_size, hash_id_scope=scope,
        tool_tokens=int(_field(p, "session", doc, "tool_tokens", int, optional=True, default=0)),
        system_tokens=int(_field(p, "session", doc, "system_tokens", int, optional=True, default=0)), items=items,
    )


def load_sessions(path: str | Path, limit: int | None = None) -> list[Session]:
    """The sessions of one file, or of every `*.json` file of a directory (sorted by name)."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.json"))
        if not files:
            raise SessionFileError(f"{p}: no *.json session files")
    elif p.exists():
        files = [p]
    else:
        raise SessionFileError(f"{p}: no such file or directory")
    return [load_session(f) for f in files[:limit]]
