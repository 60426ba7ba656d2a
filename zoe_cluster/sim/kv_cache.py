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

Optional second tier in host memory (`host_blocks` > 0), as vLLM's KV offloading connector, LMCache and SGLang's
HiCache keep one: every full prompt block is written through to host memory when it is computed, the host tier is
an LRU of its own (a hit refreshes it), and a prompt whose next blocks are gone from HBM but still in host memory
loads them back instead of recomputing them, at `host_load_s_per_token` (the host link's bandwidth; the engine
prices it, `sim.core`). Host-tier hits are counted apart from HBM hits. See docs/router.md ("Host KV tier").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Sequence
from dataclasses import dataclass

from zoe_cluster.recipes import Recipe


# The capacity formula lives with the recipes, shared with the planner.
from zoe_cluster.recipes.profile import (  # noqa: E402,F401
    LATENT_KV_ATTENTION,
    RESERVE_GB_PER_GPU,
    KvCapacity,
    host_kv_tokens,
    kv_capacity,
)


HOST_LINK_GB_S = 50.0
"""Host-to-GPU copy bandwidth per GPU, GB/s: each MI355X has its own PCIe 5.0 x16 link to a host CPU (64 GB/s per
direction, 32 GT/s x 16 lanes x 128b/130b); 50 GB/s is about 80% of that, what pinned-memory copies reach."""


@dataclass(frozen=True)
class HostKvTier:
    """A replica's host-memory KV tier: how many tokens `host_kv_gb` holds and how fast they load back."""

    tokens: int
    host_kv_gb: float
    load_s_per_token: float

    def explain(self) -> str:
        return (f"{self.tokens:,} tokens in {self.host_kv_gb:,.0f} GB of host memory, "
                f"{self.load_s_per_token * 1e6:.2f} us/token to load")


def host_kv_tier(recipe: Recipe, variant: str, host_kv_gb: float, link_gb_s: float = HOST_LINK_GB_S) -> HostKvTier:
    """The host tier of one replica of `variant` given `host_kv_gb` GB of host memory for KV (like vLLM's
    `--kv-offloading-size`, summed over the replica's ranks).

    Every rank offloads its own KV (vLLM's CPU offloading sizes a host block as the GPU block x world size;
    HiCache keeps a host pool per rank), so a latent-KV model stores tp copies per token, as in HBM. Loading is
    parallel over the ranks' own links: one rank's share of a token's KV over `link_gb_s`."""
    cap = kv_capacity(recipe, variant)
    v = recipe.variant(variant)
    gpus = v.parallelism.tp * v.parallelism.pp
    per_token_bytes = recipe.architecture.kv_bytes_per_token.value * cap.kv_copies
    tokens = host_kv_tokens(recipe, variant, host_kv_gb)
    return HostKvTier(tokens, host_kv_gb, per_token_bytes / gpus / (link_gb_s * 1e9))


class PrefixCache:
    """Block pool + prefix cache of one engine. Counts blocks; only cached blocks exist as objects."""

    __slots__ = ("num_blocks", "block_tokens", "_never_used", "_ref", "_lru", "queries_tokens", "hits_tokens",
                 "host_blocks", "host_load_s_per_token", "_host")

    def __init__(self, num_blocks: int, block_tokens: int, host_blocks: int = 0,
                 host_load_s_per_token: float = 0.0) -> None:
        if num_blocks <= 0 or block_tokens <= 0:
            raise ValueError(f"num_blocks and block_tokens must be positive ({num_blocks}, {block_tokens})")
        if host_blocks < 0 or host_load_s_per_token < 0:
            raise ValueError(f"host_blocks and host_load_s_per_token must be >= 0 ({host_blocks}, "
                             f"{host_load_s_per_token})")
        self.num_blocks = num_blocks
        self.block_tokens = block_tokens
        self.host_blocks = host_blocks
        """Blocks the host-memory tier holds (0: no host tier)."""
        self.host_load_s_per_token = host_load_s_per_token
        """Seconds to load one token's KV from host memory into HBM."""
        self._host: OrderedDict[int, None] = OrderedDict()  # host-tier block hashes, least recently used first
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
        return _leading(block_hashes, self._ref)

    def host_match(self, block_hashes: Sequence[int]) -> int:
        """Leading blocks of `block_hashes` held by the host tier."""
        return _leading(block_hashes, self._host)

    @property
    def host_cached_blocks(self) -> int:
        return len(self._host)

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
        if self.host_blocks:
            self.touch_host((block_hash,))  # write-through: the computed block is stored to host memory too
        if block_hash in self._ref:
            return False
        self._ref[block_hash] = 1
        return True

    def touch_host(self, block_hashes: Sequence[int]) -> None:
        """Store or refresh blocks in the host tier (most recently used last), evicting its LRU beyond capacity.
        The chain is touched tail first, so the host tier, like HBM, loses a prompt's tail before its head."""
        host = self._host
        for h in reversed(block_hashes):
            if h in host:
                host.move_to_end(h)
            else:
                host[h] = None
        while len(host) > self.host_blocks:
            host.popitem(last=False)

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
        if self.host_blocks and cached:
            self.touch_host(cached)  # the request's chain, head most recent, as in HBM

    def reset(self) -> int:
        """Drop every evictable cached block (vLLM's /reset_prefix_cache) and the host tier; returns how many
        HBM blocks."""
        self._host.clear()
        n = len(self._lru)
        for h in self._lru:
            del self._ref[h]
        self._lru.clear()
        self._never_used += n
        return n


def _leading(block_hashes: Sequence[int], present: Container[int]) -> int:
    """How many leading hashes are in `present` (a chain: stops at the first miss)."""
    n = 0
    for h in block_hashes:
        if h not in present:
            break
        n += 1
    return n
