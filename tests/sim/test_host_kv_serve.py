"""The host KV tier as a deployment sets it: `zoe deploy --host-kv-gb` -> the sim adapter's env -> `zoe sim serve`,
whose usage counts host-loaded tokens as cached (vLLM's num_cached_tokens: local + connector) and whose /metrics
exports them as `vllm:external_prefix_cache_hits`."""

from __future__ import annotations

import httpx
import pytest
from typer.testing import CliRunner

from tests.sim.helpers import sim_server
from zoe_cluster.engines import LaunchContext
from zoe_cluster.engines.sim import SimAdapter
from zoe_cluster.recipes import RecipeRegistry
from zoe_cluster.recipes.profile import host_kv_tokens

FAST = ("--time-scale", "0.001", "--startup-s", "0", "--kv-tokens", "2048")  # HBM: 128 blocks of 16 tokens


def _env(host_kv_gb: float) -> dict[str, str]:
    glm = RecipeRegistry.default().get("glm-5.3")
    ctx = LaunchContext(gpu_ids=(), platform="cpu", host="127.0.0.1", port=1, served_model_name="glm-5.3",
                        host_kv_gb=host_kv_gb)
    return SimAdapter().command(glm, "fp8-tp8", ctx).env


def _cached_after_eviction(url: str) -> int:
    """Prompt A, then four other prompts that push A out of the 128-block HBM cache, then A again."""
    def ask(prompt: str) -> int:
        body = {"model": "glm-5.3", "prompt": prompt, "max_tokens": 1}
        r = httpx.post(url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    a = "The quick brown fox jumps over the lazy dog. " * 60  # 675 tokens, 42 full blocks
    assert ask(a) == 0
    for i in range(4):
        ask(f"filler {i} " + "lorem ipsum dolor sit amet " * 96)
    return ask(a)


def test_the_adapter_passes_the_tier_only_when_asked():
    assert _env(0).get("ZOE_SIM_HOST_KV_GB") is None
    assert _env(500)["ZOE_SIM_HOST_KV_GB"] == "500"


@pytest.mark.parametrize("host_kv_gb", [0, 500])
def test_a_prompt_evicted_from_hbm_comes_back_from_host_memory(host_kv_gb):
    with sim_server("--model", "glm-5.3", "--variant", "fp8-tp8", *FAST, env=_env(host_kv_gb)) as (url, _):
        cached = _cached_after_eviction(url)
        info = httpx.get(url + "/sim/info").json()
        metrics = httpx.get(url + "/metrics").text
    glm = RecipeRegistry.default().get("glm-5.3")
    assert info["host_kv_capacity_tokens"] == host_kv_tokens(glm, "fp8-tp8", host_kv_gb)
    external = [line for line in metrics.splitlines() if line.startswith("vllm:external_prefix_cache_hits_total")]
    if host_kv_gb:
        assert cached == 672  # all 42 blocks, loaded back from the host tier
        assert float(external[0].split()[-1]) >= 672
    else:
        assert cached == 0  # HBM only: gone
        assert float(external[0].split()[-1]) == 0


def test_negative_host_memory_is_refused():
    from zoe_cluster.cli.main import app

    for args in (["sim", "serve", "--model", "glm-5.3", "--host-kv-gb", "-1"],
                 ["deploy", "glm-5.3", "--engine", "sim", "--host-kv-gb", "-1"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code != 0 and "--host-kv-gb must be >= 0" in result.output
