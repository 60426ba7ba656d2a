"""An approximate picture of one replica's prefix cache: an LRU set of chain block hashes.

The router records the blocks of every prompt it sends to a replica (`insert`) and asks how many leading
blocks of a new prompt are there (`match`). The set holds at most `capacity_blocks` hashes (the replica's KV
capacity in blocks), evicting the least recently used, so the router's picture forgets roughly what the engine
had to forget. Because hashes are chained, a hit on block i implies the whole prefix up to i was the same.

Precise mode corrects it from the engine's KV events: `evict_lru(n)` when the engine reports n blocks removed,
`clear()` when it reports all blocks cleared (see `routing.kv_events`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixIndex:
    """LRU set of block hashes of one replica."""

    __slots__ = ("capacity_blocks", "_lru")

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks <= 0:
            raise ValueError(f"capacity_blocks must be positive, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._lru: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._lru

    def match(self, block_hashes: Sequence[int]) -> int:
        """Leading blocks of `block_hashes` present (stops at the first miss); does not change recency."""
        lru = self._lru
        n = 0
        for h in block_hashes:
            if h not in lru:
                break
            n += 1
        return n

    def insert(self, block_hashes: Sequence[int]) -> None:
        """Record that the replica now holds these blocks, evicting the least recently used beyond capacity.

        The chain is inserted tail first, so a prompt's head is its most recent block and eviction eats chains
        from the tail (as engines free a request's blocks); a hit on a head keeps serving the whole prefix.
        A prompt longer than the capacity keeps only its first `capacity_blocks` blocks: a later prompt can only
        reuse a prefix, so the head is what is worth remembering."""
        lru = self._lru
        for h in reversed(block_hashes[: self.capacity_blocks]):
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
        while len(lru) > self.capacity_blocks:
            lru.popitem(last=False)

    def resize(self, capacity_blocks: int) -> None:
        if capacity_blocks <= 0:
            raise ValueError(f"capacity_blocks must be positive, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self.evict_lru(len(self._lru) - capacity_blocks)

    def evict_lru(self, n_blocks: int) -> int:
        """Forget the n least recently used blocks; returns how many were forgotten."""
        n = max(0, min(n_blocks, len(self._lru)))
        for _ in range(n):
            self._lru.popitem(last=False)
        return n

    def clear(self) -> None:
        self._lru.clear()
