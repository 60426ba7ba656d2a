"""The block prefix cache: hits, reference counts, LRU eviction, capacity from the recipe."""

from __future__ import annotations

import pytest

from zoe_cluster.recipes import RecipeRegistry
from zoe_cluster.sim.kv_cache import PrefixCache, kv_capacity


def test_released_blocks_stay_cached_and_hit():
    c = PrefixCache(num_blocks=10, block_tokens=16)
    assert c.allocate(3)
    for h in (1, 2, 3):
        assert c.register(h)
    c.release([1, 2, 3], private_blocks=0)
    assert c.match([1, 2, 3, 4]) == 3
    assert c.match([9, 2]) == 0  # a chain: no hit after a miss
    assert c.usage == 0.0 and c.free_blocks == 10


def test_lru_evicts_oldest_freed_first_and_never_held_blocks():
    c = PrefixCache(num_blocks=4, block_tokens=16)
    c.allocate(2)
    c.register(10), c.register(11)
    c.release([10, 11], 0)           # tail 11 freed before 10 -> 11 is older
    c.allocate(1)
    c.register(20)                   # held by a running request
    assert c.allocate(2)             # needs 1 never-used + 1 evicted: evicts 11
    assert c.match([10]) == 1 and c.match([10, 11]) == 1
    assert not c.allocate(2)         # 10 evictable (1 block) is all that is left
    assert c.match([20]) == 1        # held blocks are never evicted


def test_acquire_takes_block_out_of_lru():
    c = PrefixCache(num_blocks=2, block_tokens=16)
    c.allocate(1)
    c.register(5)
    c.release([5], 0)
    c.acquire([5])
    assert c.usage == 0.5
    assert c.allocate(1) and not c.allocate(1)


def test_capacity_follows_recipe_formula():
    r = RecipeRegistry.default().get("glm-5.3")
    fp8, mx = kv_capacity(r, "fp8-tp8"), kv_capacity(r, "mxfp4-tp8")
    v = r.variants["fp8-tp8"]
    free = 288 * 8 * v.gpu_memory_utilization - 756 - fp8.reserve_gb
    assert fp8.tokens == int(free * 1e9 / (55224 * 8))  # latent KV replicated on each of 8 TP ranks
    assert mx.tokens > fp8.tokens  # MXFP4 weights leave more room for KV (seed, Quantization)


def test_bad_sizes_rejected():
    with pytest.raises(ValueError):
        PrefixCache(0, 16)
