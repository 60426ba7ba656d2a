"""vLLM's `--long-prefill-token-threshold` in the twin: hand-computed schedules, the variant plumbing, and the flag
passing vLLM's real argument parser."""

from __future__ import annotations

import pytest

from tests.engines.test_commands import _ctx, _parse, _strip
from zoe_cluster.agentic.metrics import ttft_floor_s
from zoe_cluster.engines import get_adapter
from zoe_cluster.recipes import RecipeRegistry
from zoe_cluster.sim.core import EngineCore, LongPrefillCap, SimRequest, long_prefill_cap
from zoe_cluster.sim.kv_cache import PrefixCache
from zoe_cluster.sim.step_model import StepModel

# A step model whose prefill steps cost max(0.3 s, 1 ms per token) and nothing else: schedules add up by hand.
MODEL = StepModel(decode_base_s=0.0, decode_per_expert_s=0.0, decode_per_token_s=0.0, routed_experts=8,
                  experts_per_token=2, prefill_per_token_s=0.001, prefill_floor_s=0.3, context_per_token_s=0.0)
BUDGET = 1000


def _run(core: EngineCore) -> None:
    now = 0.0
    while (step := core.schedule(now)) is not None:
        now += step.duration_s
        core.complete(step, now)


def _ttfts(cap: LongPrefillCap) -> tuple[float, float]:
    """TTFT of a 5,000-token prompt and of a 200-token one queued right behind it (1 output token each)."""
    core = EngineCore(MODEL, PrefixCache(1000, 16), 8, BUDGET, cap)
    long, short = SimRequest("long", 5000, 1), SimRequest("short", 200, 1)
    core.add(long)
    core.add(short)
    _run(core)
    return long.first_token_s, short.first_token_s


def test_without_the_threshold_a_short_prompt_waits_for_the_long_prefill():
    # 5 steps of 1000 long tokens (1.0 s each), then the short prompt's 200 tokens (max(0.3, 0.2) s)
    long, short = _ttfts(LongPrefillCap())
    assert long == pytest.approx(5.0)
    assert short == pytest.approx(5.3)


def test_the_threshold_lets_a_short_prompt_share_the_step():
    # step 1: long 250 + short 200 tokens = 0.45 s, and the short prompt is done. From step 2 the long prefill is
    # alone (vLLM >= 0.32: uncapped): 4750 tokens in 1000-token steps, 4.75 s.
    long, short = _ttfts(LongPrefillCap(250))
    assert short == pytest.approx(0.45)
    assert long == pytest.approx(0.45 + 4.75)


def test_before_vllm_032_a_lone_request_is_capped_too():
    # step 1 as above; then 19 steps of 250 tokens, each at the 0.3 s step floor
    long, short = _ttfts(LongPrefillCap(250, cap_lone_request=True))
    assert short == pytest.approx(0.45)
    assert long == pytest.approx(0.45 + 19 * 0.3)


def test_the_threshold_caps_running_prefills_while_others_wait():
    # the long prefill is already running when the short prompt arrives: the cap is applied to it in the running
    # loop, leaving budget for the newcomer in the same step
    core = EngineCore(MODEL, PrefixCache(1000, 16), 8, BUDGET, LongPrefillCap(400))
    long = SimRequest("long", 5000, 1)
    core.add(long)
    step = core.schedule(0.0)
    assert [(r.request_id, n) for r, n in step.entries] == [("long", 1000)]  # alone: the whole budget
    core.complete(step, step.duration_s)
    core.add(SimRequest("short", 700, 1))
    step = core.schedule(1.0)
    assert [(r.request_id, n) for r, n in step.entries] == [("long", 400), ("short", 400)]


def test_the_floor_uses_a_lone_requests_chunk():
    cap = LongPrefillCap(250, cap_lone_request=True)
    assert cap.lone_chunk_tokens(BUDGET) == 250
    assert LongPrefillCap(250).lone_chunk_tokens(BUDGET) == BUDGET
    assert LongPrefillCap().lone_chunk_tokens(BUDGET) == BUDGET
    # the engine alone and the floor agree
    core = EngineCore(MODEL, PrefixCache(1000, 16), 8, BUDGET, cap)
    req = SimRequest("a", 5000, 1)
    core.add(req)
    _run(core)
    assert ttft_floor_s(MODEL, cap.lone_chunk_tokens(BUDGET), 5000, 0) == pytest.approx(req.first_token_s)


def test_a_variant_sets_the_threshold_and_its_image_release_the_lone_request_rule():
    glm = RecipeRegistry.default().get("glm-5.3")
    v029 = glm.variant("fp8-tp8-zoe").model_copy(update={"long_prefill_token_threshold": 2048})
    assert long_prefill_cap(v029) == LongPrefillCap(2048, cap_lone_request=True)  # image v0.29.0
    nightly = glm.variant("fp8-tp8-nightly").model_copy(update={"long_prefill_token_threshold": 2048})
    assert long_prefill_cap(nightly) == LongPrefillCap(2048, cap_lone_request=False)
    v032 = v029.model_copy(update={"image": "vllm/vllm-openai:v0.32.0"})
    assert long_prefill_cap(v032) == LongPrefillCap(2048, cap_lone_request=False)
    core = EngineCore.for_variant(MODEL, PrefixCache(1000, 16), v029)
    assert core.long_prefill.threshold_tokens == 2048
    assert core.max_num_batched_tokens == v029.max_num_batched_tokens
    assert long_prefill_cap(glm.variant("fp8-tp8-zoe")).threshold_tokens == 0  # unset: vLLM's default, no cap


@pytest.mark.vllm
def test_the_threshold_reaches_vllms_real_parser(vllm_python):
    glm = RecipeRegistry.default().get("glm-5.3")
    adapter = get_adapter("vllm")

    def argv(threshold: int) -> list[str]:
        recipe = glm.model_copy(deep=True)
        recipe.variants["fp8-tp8-zoe"] = recipe.variants["fp8-tp8-zoe"].model_copy(
            update={"long_prefill_token_threshold": threshold})
        return _strip("vllm", adapter.command(recipe, "fp8-tp8-zoe", _ctx(served_model_name="m")).argv)

    with_cap, without = argv(2048), argv(0)
    assert "--long-prefill-token-threshold" not in without
    bad = with_cap[:with_cap.index("--long-prefill-token-threshold") + 1] + ["many"]
    res = _parse(vllm_python, "vllm", [with_cap, without, bad])
    assert res[0]["ok"], res[0]["error"]
    assert res[0]["values"]["long_prefill_token_threshold"] == 2048
    assert res[1]["values"]["long_prefill_token_threshold"] == 0
    assert not res[2]["ok"] and "long-prefill-token-threshold" in res[2]["error"], res[2]
