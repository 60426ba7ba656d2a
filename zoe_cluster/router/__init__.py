"""The router process: an OpenAI-compatible proxy in front of the replicas (docs/router.md).

`app` (the ASGI proxy and `build_router`), `upstream` (pooled HTTP/1.1 client), `replicas` (membership applied,
health facts, ejection, slow replicas), `health` (active checks and /metrics scrapes), `admin` (/health,
/v1/models, /metrics, admin API), `membership` (the controller's push contract), `kv_events` (precise mode),
`request_checks` (JSON limits, sampling parameters and prompt forms as vLLM checks them), `slowness` (pure
decisions on slow and hung replicas) with `stall_watch` (their timers), `http_server` (read timeouts, HTTP/1.0
framing), `config`, `errors` (the one error shape). Routing decisions themselves are pure code in
`zoe_cluster.routing`.
"""
