"""Typed configuration of the router process (`zoe router ...` builds one; tests build it directly)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from zoe_cluster.routing.hashing import DEFAULT_BLOCK_TOKENS
from zoe_cluster.routing.policy import DEFAULT_POLICY, validate_policy_config


class RouterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(default="127.0.0.1", description="Address to bind; loopback unless told otherwise.")
    port: int = Field(default=8080, ge=0, le=65535, description="Port of the OpenAI API (0: any free port).")
    policy: str = Field(default=DEFAULT_POLICY, description="Routing policy name (see `zoe router --help`).")
    policy_config: dict[str, Any] = Field(default_factory=dict, description="Tunables of the policy.")
    models: list[str] = Field(
        default_factory=list,
        description="Served model names clients may ask for; empty: those the replicas declare, or any model.",
    )
    api_keys: list[str] = Field(default_factory=list, description="Bearer keys clients must send (empty: open).")
    admin_key: str | None = Field(
        default=None, description="Bearer key of the /admin endpoints (membership, drain); None disables them."
    )
    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0, description="Larger request bodies get 413.")
    max_json_depth: int = Field(
        default=128, gt=0, description="Deeper nesting of arrays and objects in a request body gets 400."
    )
    max_number_chars: int = Field(
        default=100, gt=0, description="A number literal longer than this in a request body gets 400."
    )
    header_timeout_s: float = Field(
        default=10.0, gt=0,
        description="A client must send a request's whole header within this time of its first byte (or of "
        "connecting); else the connection is closed.",
    )
    body_timeout_s: float = Field(
        default=60.0, gt=0, description="A client must send a request's whole body within this time of its header; "
        "else it gets 408 and the connection is closed.",
    )
    metrics_key: str | None = Field(
        default=None, description="Bearer key GET /metrics requires; None: /metrics is open (Prometheus scrapes it)."
    )
    max_context_tokens: int | None = Field(
        default=None, gt=0, description="Prompts estimated longer than this get 400 naming the limit."
    )
    block_tokens: int = Field(default=DEFAULT_BLOCK_TOKENS, gt=0, description="Prefix block size, tokens.")
    connect_timeout_s: float = Field(default=3.0, gt=0, description="Connecting to a replica.")
    first_byte_timeout_s: float = Field(
        default=900.0, gt=0, description="From sending the request to the response headers (covers long prefills)."
    )
    read_timeout_s: float = Field(
        default=300.0, gt=0, description="Longest silence between two chunks of a response body."
    )
    max_retries: int = Field(default=2, ge=0, description="Other replicas tried when one fails before any byte.")
    retry_statuses: list[int] = Field(
        default_factory=lambda: [500, 502, 503, 504],
        description="Upstream HTTP statuses retried on another replica (before any byte reached the client); "
        "each also counts toward passive ejection.",
    )
    migration_limit: int = Field(
        default=3, ge=0,
        description="Continuations of one stream on other replicas after its replica failed mid-stream (died, reset "
        "or stalled): the client sees one stream (zoe_cluster.router.migration); 0: the stream ends with an error "
        "event instead.",
    )
    migration_token_ids_max_prompt: int = Field(
        default=32768, ge=0,
        description="Longest prompt, tokens (the router's estimate), for which a streamed completion asks the engine "
        "for token ids (`return_token_ids`), so a continuation resumes at the exact token; longer prompts continue "
        "from text (the first event would carry every prompt token id).",
    )
    membership_file: str | None = Field(
        default=None,
        description="File where the router keeps the last membership it applied, read at start when no membership "
        "is given, so a restarted router serves its replicas at once (zoe_cluster.router.membership_store).",
    )
    picture_save_s: float = Field(
        default=2.0, ge=0,
        description="With membership_file: period of saving the router's picture (prefix indexes, KV-event mirrors "
        "and the event sequence numbers applied) beside it, also saved at shutdown and read at start "
        "(zoe_cluster.router.picture_store); 0: only at shutdown.",
    )
    picture_peers: list[str] = Field(
        default_factory=list,
        description="Base URLs (http://host:port) of peer routers asked for their picture at start when no picture "
        "file is there (a new pod): every address a host resolves to is asked (a headless Service names every pod), "
        "the answers are merged, and a router without membership takes the newest membership answered "
        "(zoe_cluster.router.picture_store.pull_picture); the admin key authenticates to them.",
    )
    picture_share_s: float = Field(
        default=0.0, ge=0,
        description="With picture_peers: every this many seconds, take the prefix-index chains each peer inserted "
        "and the sessions it routed since the last time (every address a host resolves to is asked), so routers "
        "behind a front that spreads requests with no regard to content keep one approximate picture "
        "(zoe_cluster.router.picture_sharing); 0: peers are asked only at start.",
    )
    picture_peer_timeout_s: float = Field(
        default=3.0, gt=0,
        description="Longest wait for the picture_peers at start, all together; peers that fail or are late are "
        "skipped with a log line, and the router serves without their picture.",
    )
    drain_delay_s: float = Field(
        default=0.0, ge=0,
        description="On SIGTERM: keep serving this long while /health answers 503, so load balancers stop sending "
        "new connections, before the listener closes (Kubernetes: a few seconds; the chart sets it).",
    )
    drain_timeout_s: float = Field(
        default=60.0, gt=0,
        description="On SIGTERM, after the listener closes: longest wait for in-flight requests and streams to "
        "finish before they are cut and the process exits.",
    )
    max_queue: int = Field(default=1024, ge=0, description="Requests that may wait for a free replica; more get 429.")
    queue_timeout_s: float = Field(default=30.0, gt=0, description="Longest wait in the queue before 503.")
    retry_after_s: int = Field(default=1, ge=1, description="Retry-After sent with 429/503.")
    health_interval_s: float = Field(
        default=2.0, ge=0, description="Period of the active /health and /metrics checks (0: no active checks)."
    )
    health_timeout_s: float = Field(default=2.0, gt=0, description="Timeout of one /health check.")
    unhealthy_after: int = Field(default=2, ge=1, description="Failed /health checks in a row that eject a replica.")
    passive_failures: int = Field(
        default=3, ge=1, description="Upstream failures in a row (connect, timeout, 5xx) that eject a replica."
    )
    eject_s: float = Field(
        default=10.0, gt=0, description="How long a passive ejection lasts before the replica is tried again."
    )
    stall_timeout_s: float = Field(
        default=20.0, gt=0,
        description="A replica whose streams all sent no byte for this long while one waits is hung: the waiting "
        "stream ends with an error event and the replica is ejected for eject_s.",
    )
    slow_factor: float | None = Field(
        default=3.0, gt=1,
        description="A replica whose median time per output token over its latest slow_min_samples requests exceeds "
        "this many times its peers' gets no new requests until a probe shows it recovered (None: off).",
    )
    slow_min_samples: int = Field(
        default=5, ge=1,
        description="Finished requests a replica (and a peer) needs before it can be judged slow, and the window of "
        "latest requests whose median is judged.",
    )
    slow_probe_s: float = Field(
        default=2.0, gt=0, description="Period of the single probe request sent to a replica judged slow."
    )
    kv_events_endpoint: str | None = Field(
        default=None,
        description="Precise mode for engines that connect their publisher: a ZMQ endpoint the router binds "
        "(e.g. tcp://0.0.0.0:5557), topic = replica id; only one router can bind it. Engines that bind their "
        "publisher list it in membership (MemberReplica.kv_events) and every router subscribes without this.",
    )
    scrape_metrics: bool = Field(default=True, description="Scrape each replica's /metrics with the health check.")

    @model_validator(mode="after")
    def _policy_ok(self) -> "RouterConfig":
        validate_policy_config(self.policy, self.policy_config)
        bad = [s for s in self.retry_statuses if not 500 <= s <= 599]
        if bad:
            raise ValueError(f"retry_statuses: only 5xx statuses may be retried, got {bad}")
        for url in self.picture_peers:
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:
                raise ValueError(f"picture_peers: '{url}' is not an http://host[:port] URL (peers are asked over "
                                 "plain HTTP inside the cluster)")
        return self
