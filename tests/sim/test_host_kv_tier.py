"""The host-memory KV tier: write-through, its own LRU, loads priced by the host link, capacity from host GB."""

from __future__ import annotations

import pytest

from zoe_cluster.recipes import RecipeRegistry
from zoe_cluster.routing import ReplicaView, context_from_trace, get_policy
from zoe_cluster.sim.calibrate import calibrate
from zoe_cluster.sim.core import EngineCore, SimRequest
from zoe_cluster.sim.kv_cache import HOST_LINK_GB_S, PrefixCache, host_kv_tier, kv_capacity
from zoe_cluster.sim.replay import SimReplayConfig, replay, rows_from


@pytest.fixture(scope="module")
def glm():
    return RecipeRegistry.default().get("glm-5.3")


@pytest.fixture(scope="module")
def cal(glm):
    return calibrate(glm, "fp8-tp8-zoe")


def run(core: EngineCore, now: float = 0.0) -> float:
    while (step := core.schedule(now)) is not None:
        now += step.duration_s
        core.complete(step, now)
    return now


def test_blocks_evicted_from_hbm_stay_in_host_memory():
    c = PrefixCache(num_blocks=2, block_tokens=16, host_blocks=4)
    c.allocate(2)
    c.register(1), c.register(2)
    c.release([1, 2], 0)
    c.allocate(2)  # HBM evicts both
    assert c.match([1, 2]) == 0 and c.host_match([1, 2, 3]) == 2


def test_host_lru_keeps_the_head_of_a_chain_and_refreshes_on_use():
    c = PrefixCache(num_blocks=8, block_tokens=16, host_blocks=3)
    c.allocate(2)
    c.register(1), c.register(2)  # chain A
    c.release([1, 2], 0)  # touched tail first: head 1 is the most recent
    c.allocate(2)
    c.register(7), c.register(8)  # chain B: host holds 4 blocks > 3, evicts A's tail (2), not its head
    assert c.host_match([1, 2]) == 1 and c.host_match([7, 8]) == 2
    c.touch_host([1])
    c.allocate(1)
    c.register(9)  # evicts the least recently used, 7 (8 was touched after 7 by the write-through order)
    assert c.host_match([1]) == 1 and c.host_match([7]) == 0


def test_no_host_tier_by_default():
    c = PrefixCache(num_blocks=4, block_tokens=16)
    c.allocate(1)
    c.register(1)
    assert c.host_cached_blocks == 0 and c.host_match([1]) == 0


def test_host_hit_is_loaded_not_recomputed_and_counted_apart(cal):
    bs, n = 512, 32668  # 63 full blocks + 412 tokens: prompt and output fill the 64-block HBM
    hashes = tuple(range(n // bs))
    full = len(hashes) * bs

    def second_ttft(host_blocks: int) -> tuple[float, SimRequest, EngineCore]:
        # HBM holds one prompt only: a second, different prompt evicts the first one's blocks
        core = EngineCore(cal.model, PrefixCache(64, bs, host_blocks, 1e-6))
        t = 0.0
        for rid, hs in (("a", hashes), ("x", tuple(range(1000, 1000 + n // bs)))):
            core.add(SimRequest(rid, n, 1, hs, arrival_s=t))
            t = run(core, t)
        b = SimRequest("b", n, 1, hashes, arrival_s=t)
        core.add(b)
        return run(core, t) - t, b, core

    t_miss, b_miss, _ = second_ttft(0)
    t_host, b_host, core = second_ttft(200)
    assert b_miss.cached_tokens == 0 and b_miss.host_cached_tokens == 0
    assert b_host.cached_tokens == 0 and b_host.host_cached_tokens == full
    assert core.counters.host_hits_tokens == full and core.counters.prefix_hits_tokens == 0
    load_s = full * 1e-6
    assert t_host < t_miss / 5 and t_host >= load_s  # the load is charged, far below recomputing
    # the loaded blocks are cached in HBM again: a third identical prompt hits there
    c = SimRequest("c", n, 1, hashes, arrival_s=0.0)
    core.add(c)
    run(core)
    assert c.cached_tokens == full and c.host_cached_tokens == 0


def test_host_tier_capacity_and_load_time_from_recipe(glm):
    tier = host_kv_tier(glm, "fp8-tp8-zoe", 2048)
    kv_bytes = glm.architecture.kv_bytes_per_token.value
    assert tier.tokens == int(2048e9 / (kv_bytes * 8))  # every TP rank offloads its own latent copy
    assert tier.load_s_per_token == pytest.approx(kv_bytes / (HOST_LINK_GB_S * 1e9))  # ranks load in parallel
    assert host_kv_tier(glm, "fp8-tp8-zoe", 0).tokens == 0


def test_router_index_is_sized_to_the_larger_tier():
    v = ReplicaView("r/0/0", "sim://0", kv_capacity_tokens=512 * 4, host_kv_capacity_tokens=512 * 10)
    assert v.kv_capacity_blocks(512) == 10
    pol = get_policy("prefix")
    for k in range(10):
        ctx = context_from_trace(f"q{k}", "m", (k,), 600, 1)
        pol.on_routed(ctx, pol.select(ctx, [v]))
    assert len(pol.index_of("r/0/0")) == 10


def test_replay_reports_host_hits_separately(glm, cal):
    # two long conversations re-visited after a third fills HBM: with a host tier the revisits still hit
    cap = kv_capacity(glm, "fp8-tp8-zoe").tokens
    blocks = cap // 512 // 2 + 10
    a, b, c = (tuple(range(k * 10**6, k * 10**6 + blocks)) for k in range(3))
    rows = rows_from([(0.0, blocks * 512, 1, a), (60.0, blocks * 512, 1, b), (120.0, blocks * 512, 1, c),
                      (300.0, blocks * 512 + 100, 1, a)])
    without = replay(SimReplayConfig(glm, "fp8-tp8-zoe", 1, "prefix", calibration=cal), rows)
    with_host = replay(SimReplayConfig(glm, "fp8-tp8-zoe", 1, "prefix", calibration=cal, host_kv_gb=4096), rows)
    assert without.host_hit_rate == 0.0 and with_host.host_hit_rate > 0.15
    assert with_host.prefix_hit_rate == without.prefix_hit_rate
    assert with_host.host_kv_tokens == host_kv_tier(glm, "fp8-tp8-zoe", 4096).tokens
    assert with_host.ttft_p99_s < without.ttft_p99_s
