"""Scheduler behaviours of vLLM V1 that the twin models so it can be calibrated against vLLM under load: admission
reserves the whole prompt's blocks (`scheduler_reserve_full_isl`), and a preempted request's re-admission is not
counted in the prefix-cache hit-rate counters (vLLM keeps it in `preempted_queries`)."""

from __future__ import annotations

from zoe_cluster.sim.core import EngineCore, SimRequest
from zoe_cluster.sim.kv_cache import PrefixCache
from zoe_cluster.sim.step_model import StepModel

MODEL = StepModel(decode_base_s=0.01, decode_per_expert_s=0.0, decode_per_token_s=0.0, routed_experts=1,
                  experts_per_token=1, prefill_per_token_s=1e-4, prefill_floor_s=0.0, context_per_token_s=0.0)


def _step(core: EngineCore, now: float) -> float:
    step = core.schedule(now)
    assert step is not None
    now += step.duration_s
    core.complete(step, now)
    return now


def test_a_request_waits_until_its_whole_prompt_fits():
    core = EngineCore(MODEL, PrefixCache(10, 16), max_num_seqs=8, max_num_batched_tokens=32)
    holder = SimRequest("holder", 90, 3)  # 6 blocks once prefilled, 4 left free
    core.add(holder)
    now = 0.0
    while holder.prefilling:
        now = _step(core, now)
    late = SimRequest("late", 80, 2)  # its first chunk needs 2 blocks, its prompt 5: it must wait
    core.add(late)
    now = _step(core, now)
    assert core.waiting and late.computed == 0
    while holder.finish_s is None:
        now = _step(core, now)
    now = _step(core, now)
    assert late in core.running and late.computed == 32


def test_readmission_after_preemption_is_not_a_prefix_query():
    core = EngineCore(MODEL, PrefixCache(8, 16), max_num_seqs=8, max_num_batched_tokens=256)
    a = SimRequest("a", 48, 40, tuple(range(3)))
    b = SimRequest("b", 48, 40, tuple(range(10, 13)))
    core.add(a)
    core.add(b)
    now = 0.0
    while a.finish_s is None or b.finish_s is None:
        now = _step(core, now)
    assert core.counters.preemptions >= 1
    # each request queried its prompt once, at first admission; the recompute after preemption is not counted
    assert core.counters.prefix_queries_tokens == 96
