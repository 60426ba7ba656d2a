"""The router process: an OpenAI-compatible proxy in front of the replicas (docs/router.md).

`app` (the ASGI proxy and `build_router`), `upstream` (pooled HTTP/1.1 client), `replicas` (membership applied,
health facts, ejection), `health` (active checks and /metrics scrapes), `admin` (/health, /v1/models, /metrics,
admin API), `membership` (the controller's push contract), `kv_events` (precise mode), `config`, `errors`.
Routing decisions themselves are pure code in `zoe_cluster.routing`.
"""
