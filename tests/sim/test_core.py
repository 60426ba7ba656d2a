"""The iteration-level core: chunked prefill, admission limits, preemption, shape of the fitted model."""

from __future__ import annotations

import pytest

from zoe_cluster.recipes import RecipeRegistry
from zoe_cluster.sim.calibrate import calibrate
from zoe_cluster.sim.core import EngineCore, RequestTooLarge, SimRequest
from zoe_cluster.sim.kv_cache import PrefixCache
from zoe_cluster.sim.predict import predict_decode, predict_ttft


@pytest.fixture(scope="module")
def glm():
    return RecipeRegistry.default().get("glm-5.3")


@pytest.fixture(scope="module")
def cal(glm):
    return calibrate(glm, "fp8-tp8")


def run(core: EngineCore, now: float = 0.0, fast: bool = False) -> float:
    while True:
        step = (core.fast_forward(now, float("inf")) if fast else None) or core.schedule(now)
        if step is None:
            return now
        now += step.duration_s
        core.complete(step, now)


def test_ttft_rises_with_length_and_falls_with_hit_rate(glm, cal):
    lengths = [4096, 16384, 65536, 262144]
    for hit in (0.0, 0.6, 0.9):
        t = [predict_ttft(glm, "fp8-tp8", n, hit, cal).ttft_s for n in lengths]
        assert t == sorted(t) and t[0] < t[-1]
    for n in lengths[1:]:
        t = [predict_ttft(glm, "fp8-tp8", n, h, cal).ttft_s for h in (0.0, 0.6, 0.9)]
        assert t[0] > t[1] > t[2]
    # New tokens still score the cached context: 90% cached is not 10x faster at 256K (seed table A5: 5x)
    t0 = predict_ttft(glm, "fp8-tp8", 262144, 0.0, cal).ttft_s
    t9 = predict_ttft(glm, "fp8-tp8", 262144, 0.9, cal).ttft_s
    assert 3 < t0 / t9 < 8


def test_decode_step_matches_the_seed_line(glm, cal):
    # seed table A7 (baseline, MTP off): 1 token 17.7 ms, 32 tokens 27.0 ms
    m = cal.model
    assert m.decode_step_s(1) == pytest.approx(0.0177, rel=0.03)
    assert m.decode_step_s(32) == pytest.approx(0.0270, rel=0.03)
    d1 = predict_decode(glm, "fp8-tp8", 1, 256, calibration=cal)
    d32 = predict_decode(glm, "fp8-tp8", 32, 256, calibration=cal)
    assert d1.decode_tok_s_per_node == pytest.approx(56.4, rel=0.05)
    assert d32.decode_tok_s_per_node == pytest.approx(1186.5, rel=0.05)
    assert d32.decode_tok_s_per_user < d1.decode_tok_s_per_user


def test_speculative_decoding_multiplies_per_user_rate(glm):
    off = predict_decode(glm, "fp8-tp8", 1, 256)
    on = predict_decode(glm, "fp8-tp8-mtp", 1, 256)
    assert 2.4 < on.decode_tok_s_per_user / off.decode_tok_s_per_user < 3.0  # seed table A7: 2.7x


def test_chunked_prefill_and_max_num_seqs(cal):
    core = EngineCore(cal.model, PrefixCache(100_000, 16), max_num_seqs=2, max_num_batched_tokens=1000)
    reqs = [SimRequest(f"r{i}", 2500, 3) for i in range(3)]
    for r in reqs:
        core.add(r)
    step = core.schedule(0.0)
    assert step is not None and step.prefill_tokens == 1000 and len(step.entries) == 1
    core.complete(step, step.duration_s)
    assert reqs[0].computed == 1000 and reqs[0].first_token_s is None
    now = step.duration_s
    while reqs[0].first_token_s is None:
        s = core.schedule(now)
        now += s.duration_s
        assert len(core.running) <= 2
        core.complete(s, now)
    run(core, now)
    assert all(r.output == 3 for r in reqs)
    assert reqs[2].first_token_s > reqs[1].first_token_s > reqs[0].first_token_s


def test_preemption_starts_when_kv_is_full(cal):
    def preemptions(num_blocks: int) -> int:
        core = EngineCore(cal.model, PrefixCache(num_blocks, 16), max_num_seqs=64, max_num_batched_tokens=8192)
        for i in range(16):
            core.add(SimRequest(f"r{i}", 480, 400))
        run(core)
        assert core.counters.finished == 16
        return core.counters.preemptions

    assert preemptions(16 * 60) == 0      # room for everyone: 16 x 880 tokens = 880 blocks
    assert preemptions(300) > 0            # KV fills up during decode
    with pytest.raises(RequestTooLarge):
        EngineCore(cal.model, PrefixCache(10, 16)).add(SimRequest("big", 480, 400))


def test_prefix_hit_skips_prefill_work(cal):
    core = EngineCore(cal.model, PrefixCache(10_000, 16))
    a = SimRequest("a", 32768, 1, tuple(range(2048)))
    core.add(a)
    t_a = run(core)
    b = SimRequest("b", 32768, 1, tuple(range(2048)), arrival_s=t_a)
    core.add(b)
    t_b = run(core, t_a) - t_a
    assert b.cached_tokens == 32768 - 16  # the last block is recomputed (at least one token is)
    assert t_b < t_a / 5
    assert core.counters.prefix_hits_tokens == b.cached_tokens


def test_fast_forward_gives_the_same_result(cal):
    def go(fast: bool):
        core = EngineCore(cal.model, PrefixCache(50_000, 16))
        reqs = [SimRequest(f"r{i}", 100 + 37 * i, 50 + 13 * i) for i in range(8)]
        for r in reqs:
            core.add(r)
        run(core, fast=fast)
        return [(r.first_token_s, r.finish_s) for r in reqs], core.counters.steps

    slow, fast = go(False), go(True)
    assert slow[1] == fast[1]
    for (f1, e1), (f2, e2) in zip(slow[0], fast[0]):
        assert f1 == pytest.approx(f2, rel=1e-9) and e1 == pytest.approx(e2, rel=1e-6)


def test_queued_at_the_step_boundary_and_idle_wake_up(cal):
    from dataclasses import replace

    wake = 0.004
    core = EngineCore(replace(cal.model, idle_wake_s=wake), PrefixCache(100_000, 16), max_num_batched_tokens=4096)
    a = SimRequest("a", 1000, 3, arrival_s=0.0)
    core.add(a)
    first = core.schedule(0.0)
    assert a.queued_s == 0.0  # the idle engine takes it at once
    alone = cal.model.prefill_step_s(1000, 1000 * 999 / 2, 999 * 1000 * 1999 / 6)
    assert first.duration_s == pytest.approx(alone + wake)  # the first step after idling pays the wake-up
    b = SimRequest("b", 1000, 3, arrival_s=first.duration_s / 2)
    core.add(b)  # arrives mid-step: the engine takes it when that step ends
    core.complete(first, first.duration_s)
    second = core.schedule(first.duration_s)
    assert b.queued_s == first.duration_s
    assert second.duration_s == pytest.approx(core.model.prefill_step_s(1000, 1000 * 999 / 2, 999 * 1000 * 1999 / 6,
                                                                        1, 1000.0))  # busy: no wake-up
    end = first.duration_s + second.duration_s
    core.complete(second, end)
    while core.has_work:  # both finish; the engine runs dry (no schedule() call finds it empty)
        step = core.schedule(end)
        end += step.duration_s
        core.complete(step, end)
    c = SimRequest("c", 100, 1, arrival_s=end + 1.0)
    core.add(c)
    again = core.schedule(end + 1.0)
    assert c.queued_s == end + 1.0
    assert again.duration_s == pytest.approx(core.model.prefill_step_s(100, 100 * 99 / 2, 99 * 100 * 199 / 6) + wake)


def test_prefill_chunks_are_charged_the_context_they_read(cal):
    """With a per-token cost of the context a chunk attends over, each chunk of a request pays for its start plus
    its own tokens: a 1000-token prompt in 512-token chunks reads 512 then 1000 tokens."""
    from dataclasses import replace

    m = replace(cal.model, prefill_kv_read_s=1e-5)
    core = EngineCore(m, PrefixCache(100_000, 16), max_num_batched_tokens=512)
    core.add(SimRequest("a", 1000, 1))
    first = core.schedule(0.0)
    assert first.duration_s == pytest.approx(m.prefill_step_s(512, *_sums(0, 512), kv_read_tokens=512))
    core.complete(first, first.duration_s)
    second = core.schedule(first.duration_s)
    assert second.duration_s == pytest.approx(m.prefill_step_s(488, *_sums(512, 488), kv_read_tokens=1000))


def _sums(start: int, n: int) -> tuple[float, float]:
    from zoe_cluster.sim.step_model import position_sums

    return position_sums(start, n)
