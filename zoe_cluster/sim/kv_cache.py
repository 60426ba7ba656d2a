"""The simulated engine's KV cache: a block pool with a real prefix cache, like vLLM's.

Blocks hold `block_tokens` tokens. A full prompt block is identified by its chain hash (`routing.hashing`: the
hash covers every block before it), so two requests share their first k cached blocks exactly when their
prompts share their first k blocks. Cached blocks carry a reference count; when the last request holding a
block ends, the block stays cached but becomes evictable (LRU, oldest freed first); a new allocation takes a
never-used block first, then evicts. Partial blocks and decode blocks are private to their request and return
to the free pool when it ends (vLLM also caches full output blocks; the simulator does not: see
docs/simulated-engine.md).

Capacity: (HBM x utilization - weights - reserve) / (KV bytes per token x KV copies), see
`kv_capacity_tokens`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


# The capacity formula lives with the recipes, shared with the planner.
from zoe_cluster.recipes.profile import (  # noqa: E402,F401
    LATENT_KV_ATTENTION,
    RESERVE_GB_PER_GPU,
    KvCapacity,
    kv_capacity,
)


class PrefixCache:
    """Block pool + prefix cache of one engine. Counts blocks; only cached blocks exist as objects."""

    __slots__ = ("num_blocks", "block_tokens", "_never_used", "_ref", "_lru", "queries_tokens", "hits_tokens")

    def __init__(self, num_blocks: int, block_tokens: int) -> None:
        if num_blocks <= 0 or block_tokens <= 0:
            raise ValueError(f"num_blocks and block_tokens must be positive ({num_blocks}, {block_tokens})")
        self.num_blocks = num_blocks
        self.block_tokens = block_tokens
        self._never_used = num_blocks  # blocks holding nothing (free, not cached)
        self._ref: dict[int, int] = {}  # cached block hash -> requests holding it
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached blocks nobody holds, oldest first
        self.queries_tokens = 0
        self.hits_tokens = 0

    # --- what the scheduler reads -------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        """Blocks an allocation can take now (never used + evictable cached)."""
        return self._never_used + len(self._lru)

    @property
    def usage(self) -> float:
        """Share of blocks held by running requests (vLLM's kv_cache_usage_perc, 0..1)."""
        return 1.0 - self.free_blocks / self.num_blocks

    @property
    def cached_blocks(self) -> int:
        return len(self._ref)

    def match(self, block_hashes: Sequence[int]) -> int:
        """Leading blocks of `block_hashes` that are cached (held or evictable)."""
        ref = self._ref
        n = 0
        for h in block_hashes:
            if h not in ref:
                break
            n += 1
        return n

    # --- what the scheduler does --------------------------------------------------------------------
    def acquire(self, block_hashes: Sequence[int]) -> None:
        """Take a reference on cached blocks (the hit prefix of a request being admitted)."""
        ref, lru = self._ref, self._lru
        for h in block_hashes:
            c = ref[h]
            if c == 0:
                del lru[h]
            ref[h] = c + 1

    def allocate(self, n: int) -> bool:
        """Take n blocks for a request's new tokens, evicting LRU cached blocks if needed; False if impossible."""
        if n <= 0:
            return True
        if n > self._never_used + len(self._lru):
            return False
        take = min(n, self._never_used)
        self._never_used -= take
        n -= take
        lru, ref = self._lru, self._ref
        for _ in range(n):
            h, _ = lru.popitem(last=False)
            del ref[h]
        return True

    def register(self, block_hash: int) -> bool:
        """A request's private block just filled with prompt tokens whose chain hash is `block_hash`: make it
        a cached block held by that request. False when that hash is cached already (the block stays private)."""
        if block_hash in self._ref:
            return False
        self._ref[block_hash] = 1
        return True

    def release(self, cached: Sequence[int], private_blocks: int) -> None:
        """A request ended or was preempted: drop its references and free its private blocks."""
        ref, lru = self._ref, self._lru
        # The tail of a prompt is freed first, so eviction eats chains from the end (as vLLM does).
        for h in reversed(cached):
            c = ref[h] - 1
            ref[h] = c
            if c == 0:
                lru[h] = None
        self._never_used += private_blocks

    def reset(self) -> int:
        """Drop every evictable cached block (vLLM's /reset_prefix_cache); returns how many."""
        n = len(self._lru)
        for h in self._lru:
            del self._ref[h]
        self._lru.clear()
        self._never_used += n
        return n
