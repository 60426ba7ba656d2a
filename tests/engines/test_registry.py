"""The engine registry: one list of names, an adapter registered under each, capabilities asked of the adapter."""

from __future__ import annotations

import pytest

from tests.cluster.conftest import glm
from zoe_cluster.engines import ENGINE_NAMES, EngineAdapter, get_adapter, simulated_engine


def test_every_engine_name_has_its_adapter_and_nothing_else_is_registered():
    assert {get_adapter(n).name for n in ENGINE_NAMES} == set(ENGINE_NAMES)
    with pytest.raises(ValueError, match="unknown engine 'tgi'; known: vllm, sglang, sim"):
        get_adapter("tgi")


def test_an_adapter_outside_the_names_or_a_second_one_for_a_name_is_refused():
    with pytest.raises(TypeError, match="not one of EngineName"):
        type("TgiAdapter", (EngineAdapter,), {"name": "tgi"})
    with pytest.raises(TypeError, match="two adapters for engine 'vllm'"):
        type("OtherVllm", (EngineAdapter,), {"name": "vllm"})


def test_capabilities_come_from_the_adapter():
    assert simulated_engine() == "sim"
    assert [n for n in ENGINE_NAMES if get_adapter(n).is_simulated] == ["sim"]
    assert get_adapter("vllm").places_own_workers and not get_adapter("sglang").places_own_workers
    assert get_adapter("sim").serves("vllm") and get_adapter("sim").serves("sglang")
    assert get_adapter("vllm").serves("vllm") and not get_adapter("vllm").serves("sglang")
    assert get_adapter("vllm").metric_names["running"] == "vllm:num_requests_running"
    assert get_adapter("sglang").metric_names["running"] == "sglang:num_running_reqs"
    assert all(get_adapter(n).health_path == "/health" for n in ENGINE_NAMES)


def test_the_simulated_engine_reports_its_own_kv_capacity_when_the_deployment_sets_one():
    recipe, variant = glm(), "fp8-tp8"
    real = get_adapter("vllm").kv_capacity_tokens(recipe, variant, {"ZOE_SIM_KV_TOKENS": "4096"})
    assert real > 4096  # a real engine ignores the simulated engine's knob
    assert get_adapter("sim").kv_capacity_tokens(recipe, variant, {}) == real
    assert get_adapter("sim").kv_capacity_tokens(recipe, variant, {"ZOE_SIM_KV_TOKENS": "4096"}) == 4096


def test_every_engine_a_recipe_variant_can_name_has_an_adapter():
    from zoe_cluster.recipes.schema import VARIANT_ENGINES

    assert VARIANT_ENGINES and VARIANT_ENGINES <= set(ENGINE_NAMES)
    assert all(not get_adapter(e).is_simulated for e in VARIANT_ENGINES)
