"""An approximate picture of one replica's prefix cache: LRU sets of chain block hashes, one per KV tier.

The router records the blocks of every prompt it sends to a replica (`insert`) and asks how many leading
blocks of a new prompt are there (`match`, or `match_tiers` split by tier). The HBM set holds at most
`capacity_blocks` hashes (the replica's KV capacity in blocks), evicting the least recently used, so the
router's picture forgets roughly what the engine had to forget. Because hashes are chained, a hit on block i
implies the whole prefix up to i was the same.

Engines that keep a host-memory KV tier (`host_capacity_blocks` > 0: vLLM's offloading connector, LMCache,
SGLang HiCache) write every computed block through to it; the index keeps a second LRU set of that size with the
same recency, so a block gone from HBM may still be a host-tier hit (it loads over the host link instead of
being recomputed), as in the simulated engine (`sim.kv_cache`).

Precise mode corrects the HBM set from the engine's KV events: `evict_lru(n)` when the engine reports n blocks
removed, `clear()` when it reports all blocks cleared (see `routing.kv_events`).

Several routers share what they insert (`routing.picture_sharing`): the index logs every chain `insert` records,
numbered, and a peer asks for the chains after the last number it took (`inserted_since`) and adds them to its own
index of the replica with `absorb` (which does not log them: each router publishes only its own decisions). The
log keeps at most as many block hashes as the larger tier holds: an older chain would be evicted from an index
of this size by the time it was read.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence


def _leading(block_hashes: Sequence[int], present: OrderedDict[int, None], start: int = 0) -> int:
    n = 0
    for h in block_hashes[start:]:
        if h not in present:
            break
        n += 1
    return n


class PrefixIndex:
    """LRU sets of block hashes of one replica: HBM, and optionally its host-memory tier."""

    __slots__ = ("capacity_blocks", "host_capacity_blocks", "_lru", "_host", "_log", "_log_blocks", "_next_seq")

    def __init__(self, capacity_blocks: int, host_capacity_blocks: int = 0) -> None:
        if capacity_blocks <= 0:
            raise ValueError(f"capacity_blocks must be positive, got {capacity_blocks}")
        if host_capacity_blocks < 0:
            raise ValueError(f"host_capacity_blocks must be >= 0, got {host_capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self.host_capacity_blocks = host_capacity_blocks
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._host: OrderedDict[int, None] = OrderedDict()
        self._log: deque[tuple[int, Sequence[int]]] = deque()  # (number, chain) of inserts, oldest first
        self._log_blocks = 0
        self._next_seq = 1

    def __len__(self) -> int:
        """Distinct blocks the replica can serve a hit from (either tier)."""
        if not self._host:
            return len(self._lru)
        return len(self._host) + sum(1 for h in self._lru if h not in self._host)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._lru or block_hash in self._host

    @property
    def hbm_blocks(self) -> int:
        return len(self._lru)

    def match(self, block_hashes: Sequence[int]) -> int:
        """Leading blocks of `block_hashes` present in either tier (stops at the first miss); no recency change."""
        hbm, host = self.match_tiers(block_hashes)
        return hbm + host

    def match_tiers(self, block_hashes: Sequence[int]) -> tuple[int, int]:
        """(leading blocks in HBM, blocks right after them in the host tier): what the engine would hit in HBM and
        load back from host memory."""
        hbm = _leading(block_hashes, self._lru)
        host = _leading(block_hashes, self._host, hbm) if self._host else 0
        return hbm, host

    def insert(self, block_hashes: Sequence[int]) -> None:
        """Record that the replica now holds these blocks, evicting the least recently used beyond capacity.

        The chain is inserted tail first, so a prompt's head is its most recent block and eviction eats chains
        from the tail (as engines free a request's blocks); a hit on a head keeps serving the whole prefix.
        A prompt longer than the capacity keeps only its first `capacity_blocks` blocks: a later prompt can only
        reuse a prefix, so the head is what is worth remembering."""
        self.absorb((block_hashes,))
        if block_hashes:
            self._record(block_hashes)

    def absorb(self, chains: Iterable[Sequence[int]]) -> None:
        """Insert chains another router inserted (its `inserted_since`), oldest first, without logging them."""
        for chain in chains:
            _touch(self._lru, chain, self.capacity_blocks)
            if self.host_capacity_blocks:
                _touch(self._host, chain, self.host_capacity_blocks)

    @property
    def next_seq(self) -> int:
        """The number the next logged insert gets."""
        return self._next_seq

    def inserted_since(self, seq: int) -> list[Sequence[int]]:
        """The logged chains numbered `seq` or later, oldest first (the log's oldest when it no longer reaches back
        to `seq`; all of them when `seq` is past `next_seq`, which a new index of the same replica id restarted)."""
        if seq > self._next_seq:
            seq = 0
        out = []
        for n, chain in reversed(self._log):
            if n < seq:
                break
            out.append(chain)
        out.reverse()
        return out

    def _record(self, block_hashes: Sequence[int]) -> None:
        chain = block_hashes[:max(self.capacity_blocks, self.host_capacity_blocks)]
        self._log.append((self._next_seq, chain))
        self._next_seq += 1
        self._log_blocks += len(chain)
        while self._log_blocks > max(self.capacity_blocks, self.host_capacity_blocks):
            self._log_blocks -= len(self._log.popleft()[1])

    def resize(self, capacity_blocks: int, host_capacity_blocks: int | None = None) -> None:
        if capacity_blocks <= 0:
            raise ValueError(f"capacity_blocks must be positive, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self.evict_lru(len(self._lru) - capacity_blocks)
        if host_capacity_blocks is not None:
            if host_capacity_blocks < 0:
                raise ValueError(f"host_capacity_blocks must be >= 0, got {host_capacity_blocks}")
            self.host_capacity_blocks = host_capacity_blocks
            while len(self._host) > host_capacity_blocks:
                self._host.popitem(last=False)

    def evict_lru(self, n_blocks: int) -> int:
        """Forget the n least recently used HBM blocks; returns how many were forgotten."""
        n = max(0, min(n_blocks, len(self._lru)))
        for _ in range(n):
            self._lru.popitem(last=False)
        return n

    def clear(self) -> None:
        """Forget both tiers (the engine reset its prefix cache, which drops its host tier too)."""
        self._lru.clear()
        self._host.clear()

    def snapshot(self) -> tuple[list[int], list[int]]:
        """(HBM hashes, host-tier hashes), each least recently used first: what `restore` takes back."""
        return list(self._lru), list(self._host)

    def restore(self, hbm: Sequence[int], host: Sequence[int] = ()) -> None:
        """Replace both tiers by a `snapshot` (least recently used first), kept within the capacities."""
        self._lru = OrderedDict.fromkeys(hbm[max(0, len(hbm) - self.capacity_blocks):])
        keep = self.host_capacity_blocks
        self._host = OrderedDict.fromkeys(host[max(0, len(host) - keep):] if keep else ())


def _touch(lru: OrderedDict[int, None], block_hashes: Sequence[int], capacity: int) -> None:
    for h in reversed(block_hashes[:capacity]):
        if h in lru:
            lru.move_to_end(h)
        else:
            lru[h] = None
    while len(lru) > capacity:
        lru.popitem(last=False)
