"""The router: an ASGI app that proxies OpenAI requests to the replica a routing policy picks.

    router = build_router(RouterConfig(...), membership=Membership(...))   # no module globals
    uvicorn.run(router.app, ...)   # the ASGI lifespan starts/stops the upstream client and health checks

Endpoints: POST /v1/completions and /v1/chat/completions (proxied; SSE streamed chunk by chunk), GET /v1/models,
GET /health, GET /metrics, and the admin API (bearer `admin_key`; see `zoe_cluster.router.membership`).

Per request: authenticate (401) -> read the body under the size limit (413) -> parse JSON (400) -> known model
(404) -> `RequestContext` (400 on a malformed request; 400 naming the context limit) -> wait for a replica that
is not saturated (bounded queue: 429 when full, 503 after `queue_timeout_s`; 503 when no replica is routable)
-> `policy.select` -> send upstream over pooled keep-alive connections. A connection failure, a timeout before
the response headers, or a 502/503/504 before any byte reached the client is retried on another replica (up to
`max_retries`). Once a stream has started, an upstream failure ends it with an SSE error event and `[DONE]`. A
client disconnect cancels the upstream request (its connection is closed, so the engine aborts it).

Hot path: the /v1 POST routes are a plain ASGI handler (no framework dispatch); the rest is a Starlette app.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from zoe_cluster.metrics import build_metrics
from zoe_cluster.router.admin import AuxRoutes
from zoe_cluster.router.config import RouterConfig
from zoe_cluster.router.errors import HttpError, error_body
from zoe_cluster.router.health import HealthChecker
from zoe_cluster.router.membership import MemberReplica, Membership
from zoe_cluster.router.replicas import ReplicaSet, ReplicaState
from zoe_cluster.router.upstream import UpstreamPool, UpstreamResponse
from zoe_cluster.routing.context import BadRequest, RequestContext, RoutingDecision, context_from_openai
from zoe_cluster.routing.policy import Policy, get_policy
from zoe_cluster.routing.slo import slo_class_from_headers

_PROXIED = {b"/v1/completions": "completions", b"/v1/chat/completions": "chat"}
_RETRY_STATUSES = {502, 503, 504}
_SSE_HEADERS = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


class _UpstreamFailed(Exception):
    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind


@dataclass
class _Attempt:
    st: ReplicaState
    decision: RoutingDecision
    cached_tokens: int
    prefilled: bool = False
    """The first streamed chunk arrived (the request's prefill left the replica's queue)."""


def static_membership(urls: list[str], pool: str = "default", **fields: Any) -> Membership:
    """Membership for a standalone router given replica URLs: ids "static/<i>/0"."""
    return Membership(
        version=0,
        replicas=[MemberReplica(id=f"static/{i}/0", url=u, pool=pool, **fields) for i, u in enumerate(urls)],
    )


class Router:
    """One router instance: its replicas, policy, metrics, upstream client and ASGI app."""

    def __init__(
        self,
        config: RouterConfig,
        *,
        policy: Policy | None = None,
        registry: CollectorRegistry | None = None,
        membership: Membership | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.policy = policy or get_policy(config.policy, **config.policy_config)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = build_metrics("router", self.registry)
        self.clock = clock
        self._waiters: deque[asyncio.Future] = deque()
        self.replicas = ReplicaSet(
            self.policy,
            self.metrics,
            passive_failures=config.passive_failures,
            eject_s=config.eject_s,
            unhealthy_after=config.unhealthy_after,
            clock=clock,
            on_change=self._wake,
        )
        self._children: dict[tuple, Any] = {}
        self._ids = itertools.count(1)
        self._id_prefix = f"zoe-{os.getpid():x}-{int(time.time()) & 0xFFFFFF:x}-"
        if membership is not None:
            self.apply_membership(membership)
        self.default_models = frozenset(config.models)
        self._api_keys = {k.encode() for k in config.api_keys}
        self._admin_auth = f"Bearer {config.admin_key}".encode() if config.admin_key else None
        self._matched_tokens = 0
        self._prompt_tokens = 0
        self.upstream: UpstreamPool | None = None
        self.kv_events = None  # KvEventSubscriber in precise mode
        self.health = HealthChecker(self, config)
        self._aux = AuxRoutes(self).app

    def apply_membership(self, membership: Membership) -> dict[str, list[str]]:
        """Apply a membership push (raises StaleMembership); drops cached metric children of removed replicas."""
        changes = self.replicas.apply(membership)
        if changes["removed"]:
            gone = set(changes["removed"])
            self._children = {k: v for k, v in self._children.items() if not gone & set(k[1])}
        return changes

    def _lab(self, metric: Any, *values: str) -> Any:
        """metric.labels(*values), cached: labels() costs microseconds on the hot path."""
        key = (metric, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self.upstream is None:
            self.upstream = UpstreamPool(connect_timeout_s=self.config.connect_timeout_s)
        self.health.start()
        if self.config.kv_events_endpoint and self.kv_events is None:
            from zoe_cluster.router.kv_events import KvEventSubscriber

            self.kv_events = KvEventSubscriber(self.config.kv_events_endpoint, self.policy.on_cache_evicted,
                                               known=lambda rid: rid in self.replicas.by_id)
            self.kv_events.start()

    async def stop(self) -> None:
        await self.health.stop()
        if self.kv_events is not None:
            await self.kv_events.stop()
            self.kv_events = None
        if self.upstream is not None:
            await self.upstream.close()
            self.upstream = None

    # ------------------------------------------------------------------ ASGI entry
    @property
    def app(self) -> "Router":
        """The ASGI application (the router itself)."""
        return self

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = _PROXIED.get(scope.get("raw_path") or scope["path"].encode())
            if endpoint is None and scope["path"] in ("/v1/completions", "/v1/chat/completions"):
                endpoint = "completions" if scope["path"] == "/v1/completions" else "chat"
            if endpoint is not None:
                await self._proxy(endpoint, scope, receive, send)
                return
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        await self._aux(scope, receive, send)

    async def _lifespan(self, receive: Callable, send: Callable) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as e:  # pragma: no cover
                    await send({"type": "lifespan.startup.failed", "message": str(e)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # ------------------------------------------------------------------ the proxy
    async def _respond_error(self, send: Callable, err: HttpError) -> None:
        headers = [(b"content-type", b"application/json")]
        if err.retry_after is not None:
            headers.append((b"retry-after", str(err.retry_after).encode()))
        body = error_body(err.message, err.kind, err.status)
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": err.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        self._lab(self.metrics.responses, str(err.status)).inc()

    async def _proxy(self, endpoint: str, scope: dict, receive: Callable, send: Callable) -> None:
        t0 = time.perf_counter()
        headers = dict(scope["headers"])
        try:
            if self._api_keys:
                auth = headers.get(b"authorization", b"")
                if not auth.startswith(b"Bearer ") or auth[7:].strip() not in self._api_keys:
                    raise HttpError(401, "missing or invalid API key", "authentication_error")
            raw, body = await self._read_body(headers, receive)
            ctx = self._context(endpoint, body, headers)
        except HttpError as e:
            await self._respond_error(send, e)
            return

        task = asyncio.current_task()
        state = SimpleNamespace(disconnected=False, finished=False)

        def on_message(fut: asyncio.Future) -> None:
            if fut.cancelled() or state.finished:
                return
            if fut.exception() is None and fut.result().get("type") == "http.disconnect":
                state.disconnected = True
                task.cancel()  # type: ignore[union-attr]

        watcher = asyncio.ensure_future(receive())
        watcher.add_done_callback(on_message)
        try:
            await self._forward(endpoint, send, raw, ctx, t0, state)
        except asyncio.CancelledError:
            if not state.disconnected:
                raise
            task.uncancel()  # type: ignore[union-attr]  the client left; nothing more to send
        finally:
            state.finished = True
            watcher.cancel()

    async def _read_body(self, headers: dict, receive: Callable) -> tuple[bytes, dict]:
        """The raw body (forwarded as it is) and its parsed JSON object."""
        limit = self.config.max_body_bytes
        cl = headers.get(b"content-length")
        if cl is not None and cl.isdigit() and int(cl) > limit:
            raise HttpError(413, f"request body of {int(cl)} bytes exceeds the limit of {limit} bytes")
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise HttpError(499, "client disconnected")
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise HttpError(413, f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
            if not msg.get("more_body"):
                break
        raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise HttpError(400, f"malformed JSON body: {e}") from None
        if not isinstance(body, dict):
            raise HttpError(400, "the JSON body must be an object")
        return raw, body

    def _model_label(self, model: str) -> str:
        """The model as a metric label: clients choose it freely when no model list is configured, so then
        it is "unlisted" (bounded label cardinality)."""
        return model if model in self.default_models or model in self.replicas.models() else "unlisted"

    def served_models(self) -> set[str]:
        return set(self.default_models) | self.replicas.models()

    def _context(self, endpoint: str, body: dict, headers: dict) -> RequestContext:
        rid = headers.get(b"x-request-id")
        session = headers.get(b"x-session-id")
        try:
            ctx = context_from_openai(
                endpoint,  # type: ignore[arg-type]
                body,
                request_id=rid.decode("latin-1") if rid else f"{self._id_prefix}{next(self._ids)}",
                session_header=session.decode("latin-1") if session else None,
                slo_class=slo_class_from_headers(headers),
                block_tokens=self.config.block_tokens,
            )
        except BadRequest as e:
            raise HttpError(400, str(e)) from None
        models = self.served_models()
        if models and ctx.model not in models:
            raise HttpError(404, f"model '{ctx.model}' is not served here; available: {', '.join(sorted(models))}",
                            "not_found_error")
        limit = self.config.max_context_tokens
        if limit is not None and ctx.prompt_tokens > limit:
            raise HttpError(
                400,
                f"the prompt is about {ctx.prompt_tokens} tokens, longer than the model's context of {limit} tokens",
            )
        return ctx

    # --- admission: a replica that is not saturated, or a bounded wait for one
    def _wake(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    async def _acquire(self, ctx: RequestContext, tried: set[str]) -> _Attempt:
        deadline = None
        while True:
            cands = self.replicas.candidates(ctx.model, self.default_models, tried)
            if cands:
                fitting = [s for s in cands if s.member.max_context_tokens is None
                           or ctx.prompt_tokens <= s.member.max_context_tokens]
                if not fitting:
                    top = max(s.member.max_context_tokens or 0 for s in cands)
                    raise HttpError(400, f"the prompt is about {ctx.prompt_tokens} tokens, longer than the "
                                         f"model's context of {top} tokens")
                cands = fitting
            if not cands:
                raise HttpError(503, f"no healthy replica serves model '{ctx.model}'", "service_unavailable",
                                retry_after=self.config.retry_after_s)
            if any(not s.view.saturated for s in cands):
                views = [s.view for s in cands]
                decision = self.policy.select(ctx, views)
                st = next(s for s in cands if s.id == decision.replica_id)
                return _Attempt(st, decision, decision.matched_tokens(ctx))
            # every candidate is saturated: wait in the bounded queue
            if len(self._waiters) >= self.config.max_queue:
                raise HttpError(429, "every replica is saturated and the router's queue is full", "rate_limit_error",
                                retry_after=self.config.retry_after_s)
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.config.queue_timeout_s
            if now >= deadline:
                raise HttpError(503, f"no replica became free within {self.config.queue_timeout_s:g} s",
                                "service_unavailable", retry_after=self.config.retry_after_s)
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            self.metrics.queue_depth.set(len(self._waiters))
            try:
                await asyncio.wait_for(fut, timeout=min(deadline - now, 1.0))
            except TimeoutError:
                pass
            finally:
                if not fut.done():
                    fut.cancel()
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass
                self.metrics.queue_depth.set(len(self._waiters))

    def _admit(self, ctx: RequestContext, a: _Attempt) -> None:
        self.policy.on_routed(ctx, a.decision)
        v = a.st.view
        v.admit(ctx, a.cached_tokens)
        m = self.metrics
        rid = a.st.id
        lab = self._lab
        lab(m.requests, rid, a.decision.reason).inc()
        lab(m.active_requests, rid).set(v.active_requests)
        lab(m.prompt_tokens, rid).inc(ctx.prompt_tokens)
        if a.cached_tokens:
            lab(m.prefix_matched_tokens, rid).inc(a.cached_tokens)
        self._prompt_tokens += ctx.prompt_tokens
        self._matched_tokens += a.cached_tokens
        if self._prompt_tokens:
            m.estimated_hit_rate.set(self._matched_tokens / self._prompt_tokens)
        if a.decision.spilled:
            m.pool_spillovers.labels(pool=v.pool).inc()

    def _release(self, ctx: RequestContext, a: _Attempt, ok: bool) -> None:
        v = a.st.view
        v.finish(ctx, a.cached_tokens, prefilled=a.prefilled)
        self.policy.on_finished(ctx, a.st.id, ok)
        if not a.st.removed:
            self._lab(self.metrics.active_requests, a.st.id).set(v.active_requests)
        self._wake()

    async def _forward(
        self, endpoint: str, send: Callable, payload: bytes, ctx: RequestContext, t0: float, state
    ) -> None:
        cfg = self.config
        path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
        up_headers = {"content-type": "application/json", "x-request-id": ctx.request_id}
        tried: set[str] = set()
        last_error = "no attempt"
        for attempt_no in range(cfg.max_retries + 1):
            try:
                a = await self._acquire(ctx, tried)
            except HttpError as e:
                if tried:  # every other replica is gone too: say what failed
                    e = HttpError(502, f"upstream failed ({last_error}) and no other replica is available",
                                  "upstream_error", retry_after=cfg.retry_after_s)
                await self._respond_error(send, e)
                return
            if attempt_no:
                self.metrics.retries.labels(replica=a.st.id).inc()
            self._admit(ctx, a)
            tried.add(a.st.id)
            ok = False
            try:
                resp = await self._open(a.st.view.url + path, payload, up_headers)
                try:
                    if resp.status in _RETRY_STATUSES and attempt_no < cfg.max_retries:
                        detail = (await resp.read())[:200].decode("utf-8", "replace")
                        raise _UpstreamFailed("status", f"HTTP {resp.status} from {a.st.id}: {detail}")
                    ctype = resp.headers.get("content-type", "")
                    if ctype.startswith("text/event-stream"):
                        ok = await self._stream(send, resp, ctx, a, t0, state)  # False: failed mid-stream (recorded)
                    else:
                        async with asyncio.timeout(cfg.read_timeout_s):
                            data = await resp.read()
                        await self._send_whole(send, resp.status, ctype, data, a)
                        ok = resp.status < 500
                        self._lab(self.metrics.e2e, self._model_label(ctx.model)).observe(time.perf_counter() - t0)
                        if not ok:
                            self.replicas.record_failure(a.st, "status")
                finally:
                    resp.release() if ok else resp.close()
                if ok:
                    self.replicas.record_success(a.st)
                return
            except _UpstreamFailed as e:
                last_error = str(e)
                self.replicas.record_failure(a.st, e.kind)
            except TimeoutError:  # before OSError: TimeoutError is one
                last_error = f"timeout waiting for {a.st.id}"
                self.replicas.record_failure(a.st, "timeout")
            except OSError as e:  # refused, reset, closed early (UpstreamError)
                last_error = f"{type(e).__name__} from {a.st.id}: {e}"
                self.replicas.record_failure(a.st, "connect")
            finally:
                self._release(ctx, a, ok)
        await self._respond_error(send, HttpError(502, f"upstream failed: {last_error}", "upstream_error"))

    async def _open(self, url: str, payload: bytes, headers: dict) -> UpstreamResponse:
        assert self.upstream is not None, "router not started (use the ASGI lifespan or await router.start())"
        async with asyncio.timeout(self.config.first_byte_timeout_s):
            return await self.upstream.request("POST", url, payload, headers)

    async def _send_whole(self, send: Callable, status: int, ctype: str, data: bytes, a: _Attempt) -> None:
        headers = [
            (b"content-type", (ctype or "application/json").encode("latin-1")),
            (b"content-length", str(len(data)).encode()),
            (b"x-zoe-replica", a.st.id.encode()),
            (b"x-zoe-route-reason", a.decision.reason.encode()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})
        self._lab(self.metrics.responses, str(status)).inc()

    async def _stream(self, send: Callable, resp: UpstreamResponse, ctx: RequestContext, a: _Attempt,
                      t0: float, state) -> bool:
        """Pass an SSE body through chunk by chunk; returns False when the replica failed mid-stream (the client
        got an error event and a clean end)."""
        # Wait for the first chunk before answering, so a replica that fails before any byte can be retried.
        async with asyncio.timeout(self.config.first_byte_timeout_s):
            first = await resp.readany()
        if not first:
            raise _UpstreamFailed("midstream", f"{a.st.id} closed the stream before any event")
        headers = [
            (b"content-type", b"text/event-stream"),
            (b"x-zoe-replica", a.st.id.encode()),
            (b"x-zoe-route-reason", a.decision.reason.encode()),
            *_SSE_HEADERS,
        ]
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        await send({"type": "http.response.body", "body": first, "more_body": True})
        self._lab(self.metrics.ttft, self._model_label(ctx.model)).observe(time.perf_counter() - t0)
        a.st.view.prefill_done(ctx, a.cached_tokens)
        a.prefilled = True
        self._lab(self.metrics.responses, str(resp.status)).inc()
        read_timeout = self.config.read_timeout_s
        try:
            while True:
                async with asyncio.timeout(read_timeout):
                    chunk = await resp.readany()
                if not chunk:
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except OSError as e:  # UpstreamError, or TimeoutError (also an OSError)
            kind = "timeout" if isinstance(e, TimeoutError) else "midstream"
            self.replicas.record_failure(a.st, kind)
            msg = f"replica {a.st.id} failed mid-stream ({kind}: {type(e).__name__}); the response is incomplete"
            event = json.dumps({"error": {"message": msg, "type": "upstream_error", "code": 502}})
            state.finished = True
            await send({"type": "http.response.body", "body": f"data: {event}\n\ndata: [DONE]\n\n".encode(),
                        "more_body": False})
            self._lab(self.metrics.e2e, self._model_label(ctx.model)).observe(time.perf_counter() - t0)
            return False
        state.finished = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self._lab(self.metrics.e2e, self._model_label(ctx.model)).observe(time.perf_counter() - t0)
        return True

def build_router(
    config: RouterConfig,
    *,
    membership: Membership | None = None,
    policy: Policy | None = None,
    registry: CollectorRegistry | None = None,
) -> Router:
    """A router with its own registry, policy and replica set (nothing shared between instances)."""
    return Router(config, policy=policy, registry=registry, membership=membership)
