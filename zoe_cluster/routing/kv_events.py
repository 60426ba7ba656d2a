"""Precise mode: correct the router's prefix indexes from the engines' KV-cache events (pure decoding and
bookkeeping; the ZMQ socket lives in `zoe_cluster.router.kv_events`).

vLLM and SGLang publish with `--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://*:<port>", "replay_endpoint": "tcp://*:<port + dp>", "topic": "<replica id>"}'`
(`zoe_cluster.engines.base.kv_events_config`): the engine binds a PUB socket every router connects to
(`zoe_cluster.router.kv_events`) and sends multipart messages `[topic, seq (8 bytes big-endian), payload]`, where
payload is msgpack `[ts, [event, ...], data_parallel_rank]` and each event is a map tagged by "type":
`BlockStored{block_hashes, parent_block_hash, token_ids, block_size, ...}`, `BlockRemoved{block_hashes, ...}`,
`AllBlocksCleared{}`. The topic names the replica (its "deployment/index/generation" id). With KV offloading an
event's `medium` says which tier it is about; only GPU (or unnamed) blocks count, since the router's correction is
for its HBM picture.

The engine hashes token ids with its own hash, which the router (no tokenizer) cannot reproduce, so the
correction is by amount and recency, not by block identity: when a replica's engine removes n blocks of
`block_size` tokens, the router forgets the same number of tokens from that replica's index, least recently
used first (`Policy.on_cache_evicted`); `AllBlocksCleared` empties it. The router's picture then forgets when and
as much as the engine forgets, instead of assuming the KV capacity it was told.

Data-parallel engines (vLLM `--data-parallel-size`, DP attention) keep one KV cache per DP rank and publish one
event stream per rank, each with its own sequence numbers; the batch names its rank. The mirror keys its
bookkeeping by rank (`summarize_batch` keeps the rank), so two ranks' interleaved streams are not taken for lost
batches, and per-rank block counts add up to the replica's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
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
    dp_rank: int | None = None
    """Data-parallel rank that published the batch (None when the batch does not say)."""


def decode_batch(payload: bytes) -> list[dict[str, Any]]:
    """The events of one msgpack batch `[ts, events, dp_rank]` as maps with a "type" key."""
    return _decode(payload)[0]


def summarize_batch(payload: bytes) -> KvEventSummary:
    """`summarize(decode_batch(payload))` with the batch's data-parallel rank."""
    events, rank = _decode(payload)
    return replace(summarize(events), dp_rank=rank)


def _decode(payload: bytes) -> tuple[list[dict[str, Any]], int | None]:
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
    rank = batch[2] if len(batch) > 2 and isinstance(batch[2], int) and not isinstance(batch[2], bool) else None
    return events, rank


def summarize(events: list[dict[str, Any]]) -> KvEventSummary:
    stored = removed = 0
    cleared = False
    block_size = None
    for ev in events:
        kind = ev["type"]
        medium = ev.get("medium")
        if isinstance(medium, str) and medium.upper() != "GPU":
            continue  # a host-memory tier's block (KV offloading): the router's HBM picture is unaffected
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
class RankCache:
    """One data-parallel rank's stream: its sequence and the blocks it holds."""

    blocks: int = 0
    last_seq: int | None = None


@dataclass
class ReplicaCacheMirror:
    """Per-replica running totals from its events, kept per data-parallel rank (shown in the admin API; drives
    corrections)."""

    block_size: int = 16
    """Tokens per engine block; updated from BlockStored events."""
    gaps: int = 0
    """Batches lost (sequence numbers skipped within a rank's stream): the mirror is approximate after a gap."""
    history: dict[str, int] = field(default_factory=lambda: {"stored": 0, "removed": 0, "cleared": 0})
    ranks: dict[int | None, RankCache] = field(default_factory=dict)
    """Per data-parallel rank (None: batches that name no rank)."""

    @property
    def blocks(self) -> int:
        """Blocks the engine holds now over all its ranks (stored - removed since each rank's last clear)."""
        return sum(r.blocks for r in self.ranks.values())

    @property
    def last_seq(self) -> int | None:
        return max((r.last_seq for r in self.ranks.values() if r.last_seq is not None), default=None)

    def apply(self, summary: KvEventSummary, seq: int | None = None) -> int | None:
        """Fold one batch in; returns the tokens the router should forget (None: forget everything)."""
        rank = self.ranks.setdefault(summary.dp_rank, RankCache())
        if seq is not None:
            if rank.last_seq is not None and seq > rank.last_seq + 1:
                self.gaps += seq - rank.last_seq - 1
            rank.last_seq = seq
        if summary.block_size:
            self.block_size = summary.block_size
        if summary.cleared:
            self.history["cleared"] += 1
            if len(self.ranks) > 1:  # one rank cleared: forget its share, not the other ranks' blocks
                forget, rank.blocks = rank.blocks * self.block_size, 0
                return forget
            rank.blocks = 0
            return None
        rank.blocks = max(0, rank.blocks + summary.stored_blocks - summary.removed_blocks)
        self.history["stored"] += summary.stored_blocks
        self.history["removed"] += summary.removed_blocks
        return summary.removed_blocks * self.block_size
