"""`zoe sim serve` as a real process: the real `openai` client (streaming too), errors, metrics, faults."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from zoe_cluster.engines.sim import SimAdapter
from zoe_cluster.recipes import RecipeRegistry
from zoe_cluster.sim.server import ServerConfig, SimServer
from tests.sim.helpers import sim_server

FAST = ("--model", "glm-5.3", "--variant", "fp8-tp8", "--time-scale", "0.001", "--startup-s", "0")


@pytest.fixture(scope="module")
def server():
    with sim_server(*FAST, "--served-model-name", "glm", "--max-model-len", "32768") as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=30)


def test_models_and_completion(client):
    assert [m.id for m in client.models.list().data] == ["glm"]
    r = client.completions.create(model="glm", prompt="x" * 400, max_tokens=7)
    assert r.usage.prompt_tokens == 100 and r.usage.completion_tokens == 7
    assert len(r.choices[0].text) == 7 * 4 and r.choices[0].finish_reason == "length"


def test_repeated_prompt_hits_the_prefix_cache(client):
    prompt = "The quick brown fox jumps over the lazy dog. " * 60  # 675 tokens
    first = client.completions.create(model="glm", prompt=prompt, max_tokens=2)
    again = client.completions.create(model="glm", prompt=prompt, max_tokens=2)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == 672  # whole 16-token blocks, last token recomputed


def test_chat_streaming_with_usage(client):
    stream = client.chat.completions.create(
        model="glm", messages=[{"role": "user", "content": "hello " * 50}], max_tokens=12, stream=True,
        stream_options={"include_usage": True},
    )
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert len(text) == 48 and finish == "length"
    assert usage.completion_tokens == 12 and usage.prompt_tokens > 70


def test_completion_streaming(client):
    parts = [c.choices[0].text for c in client.completions.create(model="glm", prompt="abcd" * 10, max_tokens=5,
                                                                  stream=True) if c.choices]
    assert len("".join(parts)) == 20


def test_bad_requests(server, client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="32768"):  # names the context limit
        client.completions.create(model="glm", prompt="x" * 4 * 32000, max_tokens=1000)
    r = httpx.post(server + "/v1/completions", json={"model": "glm"})
    assert r.status_code == 400 and "prompt" in r.json()["error"]["message"]
    r = httpx.post(server + "/v1/chat/completions", json={"prompt": "x"})
    assert r.status_code == 400 and "model" in r.json()["error"]["message"]
    r = httpx.post(server + "/v1/chat/completions", json={"model": "glm", "messages": []})
    assert r.status_code == 400
    r = httpx.post(server + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400


def test_metrics_have_vllm_names_and_parse(server, client):
    client.completions.create(model="glm", prompt="y" * 800, max_tokens=3)
    text = httpx.get(server + "/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
                 "vllm:num_preemptions_total"):
        assert f'{name}{{engine="0"' in text or f"{name}{{" in text, name
    assert 'model_name="glm"' in text
    stats = SimAdapter().parse_metrics(text, time.time())
    assert stats.prompt_tokens >= 200 and stats.generation_tokens >= 3 and stats.prefix_cache_hits > 0


def test_sglang_mode_and_startup_delay():
    # 2 simulated seconds of weight loading at time scale 0.5 = 1 s of 503s
    with sim_server("--model", "glm-5.3", "--time-scale", "0.5", "--startup-s", "2", "--metrics", "sglang",
                    wait_ready=False) as (url, _):
        r = httpx.get(url + "/health")
        if r.status_code == 503:
            assert httpx.post(url + "/v1/completions", json={"model": "glm-5.3", "prompt": "a"}).status_code == 503
        deadline = time.monotonic() + 10
        while httpx.get(url + "/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        httpx.post(url + "/v1/completions", json={"model": "glm-5.3", "prompt": "abcd" * 40, "max_tokens": 2},
                   timeout=30)
        text = httpx.get(url + "/metrics").text
        assert "sglang:num_running_reqs" in text and "vllm:" not in text
        assert SimAdapter().parse_metrics(text, 0.0).prompt_tokens == 40


def test_faults_error_after_and_crash():
    with sim_server(*FAST, "--error-after", "2", "--crash-after", "4") as (url, proc):
        body = {"model": "glm-5.3", "prompt": "abcd", "max_tokens": 1}
        assert httpx.post(url + "/v1/completions", json=body).status_code == 200
        r = httpx.post(url + "/v1/completions", json=body)
        assert r.status_code == 500 and "injected" in r.json()["error"]["message"]
        assert httpx.get(url + "/health").status_code == 200  # still "healthy"
        httpx.post(url + "/v1/completions", json=body)
        with pytest.raises(httpx.HTTPError):
            httpx.post(url + "/v1/completions", json=body)
        assert proc.wait(10) == 3


def test_hang_fault_set_at_run_time():
    with sim_server(*FAST) as (url, _):  # without --fault-endpoint there is no fault endpoint
        assert httpx.post(url + "/sim/faults", json={"hang_after": 1}).status_code == 404
    with sim_server(*FAST, "--fault-endpoint") as (url, _):
        r = httpx.post(url + "/sim/faults", json={"hang_after": 1})
        assert r.status_code == 200 and r.json()["hang_after"] == 1
        with pytest.raises(httpx.TimeoutException):
            httpx.post(url + "/v1/completions", json={"model": "glm-5.3", "prompt": "a"}, timeout=1.0)
        with pytest.raises(httpx.TimeoutException):
            httpx.get(url + "/health", timeout=1.0)
        assert httpx.post(url + "/sim/faults", json={"slowdown": -1}).status_code == 400
        assert httpx.post(url + "/sim/faults", json={"hang_after": None}).status_code == 200
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        r = httpx.post(url + "/v1/completions", json={"model": "glm-5.3", "prompt": "abcd", "max_tokens": 2}, timeout=10)
        assert r.status_code == 200


def test_same_seed_same_text():
    outs = []
    for _ in range(2):
        with sim_server(*FAST, "--seed", "7") as (url, _):
            r = httpx.post(url + "/v1/completions", json={"model": "glm-5.3", "prompt": "abcd", "max_tokens": 6})
            outs.append(r.json()["choices"][0]["text"])
    assert outs[0] == outs[1]


def test_health_answers_while_a_large_prompt_is_prepared():
    """A request's parsing, rendering and hashing run off the event loop: /health answers within a bound while
    one takes a second of CPU (Python-level work that holds the GIL; the loop gets it back every switch interval).
    With the preparation on the loop, /health waited the whole second."""
    server = SimServer(RecipeRegistry.default().get("glm-5.3"), "fp8-tp8",
                       ServerConfig(served_model_name="glm", time_scale=0.001, startup_s=0.0))
    prepare = server._prepare

    def slow_prepare(raw: bytes, chat: bool):
        end = time.perf_counter() + 1.0
        while time.perf_counter() < end:
            sum(range(1000))
        return prepare(raw, chat)

    server._prepare = slow_prepare

    async def run() -> list[float]:
        async with server._lifespan(server.app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=server.app), base_url="http://sim") as c:
                big = asyncio.create_task(c.post("/v1/chat/completions", json={
                    "model": "glm", "messages": [{"role": "user", "content": "abcdefgh " * 60_000}],
                    "max_tokens": 2}))
                waits = []
                while not big.done():
                    t = time.perf_counter()
                    assert (await c.get("/health")).status_code == 200
                    waits.append(time.perf_counter() - t)
                    await asyncio.sleep(0.01)
                r = await big
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
                return waits

    waits = asyncio.run(run())
    assert len(waits) >= 5, waits  # /health was asked again and again while the request was prepared
    assert max(waits) < 0.1, waits  # 3-6 ms measured on an idle machine
