"""The simulated engine's /metrics: vLLM V1 names and labels, or SGLang's names in SGLang mode.

vLLM mode (labels `engine`, `model_name`; as `zoe_cluster.engines.vllm` parses them):
`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (0..1),
`vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total` (tokens), `vllm:prompt_tokens_total`,
`vllm:generation_tokens_total`, `vllm:num_preemptions_total`, `vllm:request_success_total{finished_reason}`,
histograms `vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds`,
`vllm:e2e_request_latency_seconds`, `vllm:request_prompt_tokens`,
`vllm:request_generation_tokens`.

SGLang mode (label `model_name`; as `zoe_cluster.engines.sglang` parses them): `sglang:num_running_reqs`,
`sglang:num_queue_reqs`, `sglang:token_usage`, `sglang:cache_hit_rate`, `sglang:prompt_tokens_total`,
`sglang:cached_tokens_total`, `sglang:generation_tokens_total`, `sglang:num_retracted_requests_total`,
histograms `sglang:time_to_first_token_seconds`, `sglang:inter_token_latency_seconds`,
`sglang:e2e_request_latency_seconds`.

Latencies are simulated seconds (what the modelled hardware would show), whatever the time scale.
Each server has its own registry (no module globals).
"""

from __future__ import annotations

from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from zoe_cluster.engines.sglang import SglangAdapter
from zoe_cluster.engines.vllm import VllmAdapter
from zoe_cluster.sim.core import EngineCore, SimRequest

MetricsMode = Literal[VllmAdapter.name, SglangAdapter.name]  # type: ignore[valid-type]
"""Whose metric names the simulated engine exports: a real engine's, read from its adapter."""

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000,
                 500000, 1000000)


def _counter(sample_name: str) -> str:
    """The name a Counter is created with for a `..._total` sample name (prometheus_client adds the suffix)."""
    return sample_name.removesuffix("_total")


def _vllm_metrics(m: "SimMetrics", model_name: str) -> tuple[list[str], dict[str, str]]:
    """vLLM V1's metrics (labels `engine`, `model_name`), names as `VllmAdapter` reads them."""
    names, labels, r, n = ["engine", "model_name"], {"engine": "0", "model_name": model_name}, m.registry, m.names
    p = m.prefix
    m.running = Gauge(n["running"], "Requests in the running batch.", names, registry=r)
    m.waiting = Gauge(n["waiting"], "Requests waiting to be scheduled.", names, registry=r)
    m.kv = Gauge(n["kv_cache_usage"], "KV-cache usage, 1 = full.", names, registry=r)
    m.queries = Counter(_counter(n["prefix_cache_queries"]), "Prefix-cache queries, tokens.", names, registry=r)
    m.hits = Counter(_counter(n["prefix_cache_hits"]), "Prefix-cache hits, tokens.", names, registry=r)
    m.external_hits = Counter(p + "external_prefix_cache_hits",
                              "Prompt tokens loaded from the host KV tier (vLLM's KV offloading), tokens.",
                              names, registry=r)
    m.prompt = Counter(_counter(n["prompt_tokens"]), "Prefilled prompt tokens.", names, registry=r)
    m.gen = Counter(_counter(n["generation_tokens"]), "Generated tokens.", names, registry=r)
    m.preempt = Counter(_counter(n["preemptions"]), "Preemptions.", names, registry=r)
    m.success = Counter(p + "request_success", "Finished requests.", names + ["finished_reason"], registry=r)
    m.req_prompt = Histogram(p + "request_prompt_tokens", "Prompt tokens per request.", names,
                             buckets=TOKEN_BUCKETS, registry=r)
    m.req_gen = Histogram(p + "request_generation_tokens", "Generated tokens per request.", names,
                          buckets=TOKEN_BUCKETS, registry=r)
    m.cache_hit_rate = None
    return names, labels


def _sglang_metrics(m: "SimMetrics", model_name: str) -> tuple[list[str], dict[str, str]]:
    """SGLang's metrics (label `model_name`), names as `SglangAdapter` reads them: its prompt-token counter is also
    its prefix-cache query count (every prompt token is a query)."""
    names, labels, r, n = ["model_name"], {"model_name": model_name}, m.registry, m.names
    m.running = Gauge(n["running"], "Running requests.", names, registry=r)
    m.waiting = Gauge(n["waiting"], "Queued requests.", names, registry=r)
    m.kv = Gauge(n["kv_cache_usage"], "KV token usage, 1 = full.", names, registry=r)
    m.cache_hit_rate = Gauge(m.prefix + "cache_hit_rate", "Prefix-cache hit rate.", names, registry=r)
    m.queries = Counter(_counter(n["prefix_cache_queries"]), "Prompt tokens.", names, registry=r)
    m.hits = Counter(_counter(n["prefix_cache_hits"]), "Prompt tokens served from the prefix cache.", names,
                     registry=r)
    m.prompt = m.queries
    m.gen = Counter(_counter(n["generation_tokens"]), "Generated tokens.", names, registry=r)
    m.preempt = Counter(_counter(n["preemptions"]), "Retracted (preempted) requests.", names, registry=r)
    m.success = None
    m.req_prompt = m.req_gen = None
    m.external_hits = None
    return names, labels


DIALECTS = {VllmAdapter.name: (VllmAdapter, _vllm_metrics), SglangAdapter.name: (SglangAdapter, _sglang_metrics)}
"""Metrics mode -> the real engine's adapter (its metric names) and the builder of the rest of its metrics."""


class SimMetrics:
    """Prometheus metrics of one simulated engine, updated by the server's engine loop."""

    def __init__(self, mode: MetricsMode, model_name: str) -> None:
        if mode not in DIALECTS:
            raise ValueError(f"metrics mode must be one of {', '.join(map(repr, DIALECTS))}, got {mode!r}")
        adapter, build = DIALECTS[mode]
        self.mode = mode
        self.names = adapter.metric_names
        self.prefix = self.names["running"].split(":")[0] + ":"
        self.registry = CollectorRegistry()
        r, p = self.registry, self.prefix
        names, labels = build(self, model_name)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Time to first token.", names,
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(p + "inter_token_latency_seconds", "Time between output steps of a request.", names,
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "End-to-end request latency.", names,
                             buckets=E2E_BUCKETS, registry=r)
        self._labels = labels
        self._last = {"q": 0, "h": 0, "p": 0, "g": 0, "x": 0, "e": 0}
        # Children bound to the labels once (cheaper per update).
        for attr in ("running", "waiting", "kv", "queries", "hits", "gen", "preempt", "ttft", "itl", "e2e",
                     "req_prompt", "req_gen", "cache_hit_rate", "external_hits"):
            m = getattr(self, attr)
            setattr(self, "_" + attr, m.labels(**labels) if m is not None else None)
        # A separate prompt counter only where the engine has one (SGLang's is its query count).
        self._prompt_child = self.prompt.labels(**labels) if self.prompt is not self.queries else None
        for g in (self._running, self._waiting, self._kv):  # export zeros before the first request
            g.set(0)

    def sync(self, core: EngineCore) -> None:
        """Copy the engine's gauges and counter deltas."""
        c, last = core.counters, self._last
        self._running.set(core.num_running)
        self._waiting.set(core.num_waiting)
        self._kv.set(core.cache.usage)
        for key, value, child in (("q", c.prefix_queries_tokens, self._queries),
                                  ("h", c.prefix_hits_tokens, self._hits),
                                  ("p", c.prompt_tokens, self._prompt_child),
                                  ("e", c.host_hits_tokens, self._external_hits)):
            if child is not None and value > last[key]:
                child.inc(value - last[key])
                last[key] = value
        if self._cache_hit_rate is not None and c.prefix_queries_tokens:
            self._cache_hit_rate.set(c.prefix_hits_tokens / c.prefix_queries_tokens)
        if c.generation_tokens > last["g"]:
            self._gen.inc(c.generation_tokens - last["g"])
            last["g"] = c.generation_tokens
        if c.preemptions > last["x"]:
            self._preempt.inc(c.preemptions - last["x"])
            last["x"] = c.preemptions

    def first_token(self, ttft_s: float) -> None:
        self._ttft.observe(ttft_s)

    def step_output(self, step_s: float) -> None:
        self._itl.observe(step_s)

    def finished(self, req: SimRequest, e2e_s: float) -> None:
        self._e2e.observe(e2e_s)
        if self.success is not None:
            self.success.labels(**self._labels, finished_reason="length").inc()
            self._req_prompt.observe(req.prompt_tokens)
            self._req_gen.observe(req.output)

    def render(self) -> bytes:
        return generate_latest(self.registry)
