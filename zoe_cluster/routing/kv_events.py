"""Precise mode: correct the router's prefix indexes from the engines' KV-cache events (pure decoding and
bookkeeping; the ZMQ socket lives in `zoe_cluster.router.kv_events`).

vLLM publishes with `--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://<router-host>:<port>", "topic": "<replica id>"}'`: it connects to the router's bound SUB socket
and sends multipart messages `[topic, seq (8 bytes big-endian), payload]`, where payload is msgpack
`[ts, [event, ...], data_parallel_rank]` and each event is a map tagged by "type":
`BlockStored{block_hashes, parent_block_hash, token_ids, block_size, ...}`, `BlockRemoved{block_hashes, ...}`,
`AllBlocksCleared{}`. The topic names the replica (its "deployment/index/generation" id).

The engine hashes token ids with its own hash, which the router (no tokenizer) cannot reproduce, so the
correction is by amount and recency, not by block identity: when a replica's engine removes n blocks of
`block_size` tokens, the router forgets the same number of tokens from that replica's index, least recently
used first (`Policy.on_cache_evicted`); `AllBlocksCleared` empties it. The router's picture then forgets when and
as much as the engine forgets, instead of assuming the KV capacity it was told.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack


class KvEventDecodeError(ValueError):
    """A payload that is not a vLLM KV event batch."""


@dataclass(frozen=True)
class KvEventSummary:
    """What one event batch did to a replica's cache."""

    stored_blocks: int = 0
    removed_blocks: int = 0
    cleared: bool = False
    block_size: int | None = None
    """Tokens per engine block (from BlockStored events; None when the batch had none)."""


def decode_batch(payload: bytes) -> list[dict[str, Any]]:
    """The events of one msgpack batch `[ts, events, dp_rank]` as maps with a "type" key."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.exceptions.ExtraData, TypeError) as e:
        raise KvEventDecodeError(f"not msgpack: {e}") from None
    if not isinstance(batch, (list, tuple)) or len(batch) < 2 or not isinstance(batch[1], (list, tuple)):
        raise KvEventDecodeError("expected [ts, [events...], dp_rank]")
    events = []
    for ev in batch[1]:
        if isinstance(ev, dict) and isinstance(ev.get("type"), str):
            events.append(ev)
        elif isinstance(ev, (list, tuple)) and ev and isinstance(ev[0], str):
            # array-like encoding: [tag, field0, field1, ...] in declaration order
            names = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size"),
                     "BlockRemoved": ("block_hashes",), "AllBlocksCleared": ()}.get(ev[0], ())
            events.append({"type": ev[0], **dict(zip(names, ev[1:]))})
        else:
            raise KvEventDecodeError(f"unrecognised event {ev!r:.80}")
    return events


def summarize(events: list[dict[str, Any]]) -> KvEventSummary:
    stored = removed = 0
    cleared = False
    block_size = None
    for ev in events:
        kind = ev["type"]
        if kind == "BlockStored":
            stored += len(ev.get("block_hashes") or ())
            if isinstance(ev.get("block_size"), int) and ev["block_size"] > 0:
                block_size = ev["block_size"]
        elif kind == "BlockRemoved":
            removed += len(ev.get("block_hashes") or ())
        elif kind == "AllBlocksCleared":
            cleared, stored, removed = True, 0, 0  # what came before the clear no longer matters
    return KvEventSummary(stored, removed, cleared, block_size)


@dataclass
class ReplicaCacheMirror:
    """Per-replica running totals from its events (shown in the admin API; drives corrections)."""

    block_size: int = 16
    """Tokens per engine block; updated from BlockStored events."""
    blocks: int = 0
    """Blocks the engine holds now (stored - removed since the last clear), as far as events tell."""
    last_seq: int | None = None
    gaps: int = 0
    """Batches lost (sequence numbers skipped): the mirror is approximate after a gap."""
    history: dict[str, int] = field(default_factory=lambda: {"stored": 0, "removed": 0, "cleared": 0})

    def apply(self, summary: KvEventSummary, seq: int | None = None) -> int | None:
        """Fold one batch in; returns the tokens the router should forget (None: forget everything)."""
        if seq is not None:
            if self.last_seq is not None and seq > self.last_seq + 1:
                self.gaps += seq - self.last_seq - 1
            self.last_seq = seq
        if summary.block_size:
            self.block_size = summary.block_size
        if summary.cleared:
            self.blocks = 0
            self.history["cleared"] += 1
            return None
        self.blocks = max(0, self.blocks + summary.stored_blocks - summary.removed_blocks)
        self.history["stored"] += summary.stored_blocks
        self.history["removed"] += summary.removed_blocks
        return summary.removed_blocks * self.block_size
