"""The router: an ASGI app that proxies OpenAI requests to the replica a routing policy picks.

    router = build_router(RouterConfig(...), membership=Membership(...))   # no module globals
    uvicorn.run(router.app, ...)   # the ASGI lifespan starts/stops the upstream client and health checks

Endpoints: POST /v1/completions and /v1/chat/completions (proxied; SSE streamed chunk by chunk), GET /v1/models,
GET /health, GET /metrics, and the admin API (bearer `admin_key`; see `zoe_cluster.router.membership`).

Per request: authenticate (401) -> read the body under the size limit (413) -> parse JSON under the depth and
number limits (400) -> sampling parameters and prompt form as vLLM checks them (400, `request_checks`) -> known
model (404) -> `RequestContext` (400 naming the context limit) -> wait for a replica that is not saturated
(bounded queue: 429 when full, 503 after `queue_timeout_s`; 503 when no replica is routable) -> a due recovery
probe of a slow replica, else `policy.select` over the replicas not judged slow -> send upstream over pooled
keep-alive connections. A connection failure, a timeout or a stall before the response headers, or a status of
`retry_statuses` (500, 502-504) before any byte reached the client is retried on another replica (up to
`max_retries`) and counts toward passive ejection. Once a stream has started, an upstream failure or a stall
(`router.slowness.stall_verdict`: the replica's streams all silent for `stall_timeout_s`, which ejects it)
continues the stream on another replica (`router.migration`, up to `migration_limit` times) or, when it cannot,
ends it with an SSE error event and `[DONE]`. Sending upstream and relaying answers is `router.forwarding`, a mixin
of `Router`. With `membership_file`, the last applied membership is kept there and read at start
(`router.membership_store`), and the picture (prefix indexes, KV-event mirrors) beside it (`router.picture_store`);
without a picture file, `picture_peers` are asked for theirs at start (bounded by `picture_peer_timeout_s`), and
with `picture_share_s` every period for the chains they inserted since (`router.picture_sharing`).
Precise mode: the router subscribes to every KV-event publisher the membership lists (`router.kv_events`). A client disconnect cancels the upstream request (its connection is
closed, so the engine aborts it). Finished requests feed the replica's latest times per output token, whose median
`router.slowness` judges against its peers'. Errors, the router's and the engines', reach the client in one shape
(`router.errors`). Header and body read timeouts and HTTP/1.0 framing are the server's (`router.http_server`).

Hot path: the /v1 POST routes are a plain ASGI handler (no framework dispatch); the rest is a Starlette app.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from zoe_cluster.metrics import build_metrics
from zoe_cluster.router.admin import AuxRoutes
from zoe_cluster.router.config import RouterConfig
from zoe_cluster.router.drain import closing_connection
from zoe_cluster.router.errors import HttpError, error_body
from zoe_cluster.router.health import HealthChecker
from zoe_cluster.router.kv_events import KvEventSubscriber
from zoe_cluster.router.membership import MemberReplica, Membership
from zoe_cluster.router.membership_store import load_membership, save_membership
from zoe_cluster.router.picture_sharing import PictureSharer
from zoe_cluster.router.picture_store import PictureKeeper, apply_picture, picture_path, pull_picture
from zoe_cluster.router.forwarding import Forwarding, _Attempt
from zoe_cluster.router.replicas import ReplicaSet
from zoe_cluster.router.request_checks import RequestError, check_sampling, parse_json_body
from zoe_cluster.router.upstream import UpstreamPool
from zoe_cluster.routing.accounting import LoadLedger
from zoe_cluster.routing.chat_prefix import ChatPrefixCache
from zoe_cluster.routing.context import BadRequest, RequestContext, RoutingDecision, context_from_openai
from zoe_cluster.routing.hashing import TextChain
from zoe_cluster.routing.policy import Policy, get_policy
from zoe_cluster.routing.slo import slo_class_from_headers

_PROXIED = {b"/v1/completions": "completions", b"/v1/chat/completions": "chat"}
_log = logging.getLogger(__name__)


def static_membership(urls: list[str], pool: str = "default", **fields: Any) -> Membership:
    """Membership for a standalone router given replica URLs: ids "static/<i>/0"."""
    return Membership(
        version=0,
        replicas=[MemberReplica(id=f"static/{i}/0", url=u, pool=pool, **fields) for i, u in enumerate(urls)],
    )


class Router(Forwarding):
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
        self.load_ledger = LoadLedger(self.policy)
        """Load bookkeeping of every request (the same implementation `zoe sim replay` drives)."""
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
            slow_factor=config.slow_factor,
            slow_min_samples=config.slow_min_samples,
            slow_probe_s=config.slow_probe_s,
        )
        self._retry_statuses = frozenset(config.retry_statuses)
        self._children: dict[tuple, Any] = {}
        self._ids = itertools.count(1)
        self._id_prefix = f"zoe-{os.getpid():x}-{int(time.time()) & 0xFFFFFF:x}-"
        self.kv_events: KvEventSubscriber | None = None  # subscribes to the publishers membership lists
        self.picture: PictureKeeper | None = None  # with membership_file: the picture saved beside it
        self.sharer: PictureSharer | None = None  # with picture_peers and picture_share_s: takes the peers' inserts
        self.instance_id = f"{os.getpid():x}-{os.urandom(6).hex()}"
        """This process among its peers (a picture delta names the router that answered it)."""
        self.draining = False
        """SIGTERM received: /health answers 503 while in-flight requests finish (`zoe router`'s server)."""
        if membership is None and config.membership_file:
            membership = load_membership(config.membership_file)
        if membership is not None:
            self.apply_membership(membership)
        self.default_models = frozenset(config.models)
        self._api_keys = {k.encode() for k in config.api_keys}
        self._admin_auth = f"Bearer {config.admin_key}".encode() if config.admin_key else None
        self._matched_tokens = 0
        self._prompt_tokens = 0
        self.upstream: UpstreamPool | None = None
        self.health = HealthChecker(self, config)
        self.chat_prefixes = ChatPrefixCache(
            config.block_tokens, max_depth=config.max_json_depth, max_number_chars=config.max_number_chars
        )
        self._aux = AuxRoutes(self).app

    def apply_membership(self, membership: Membership) -> dict[str, list[str]]:
        """Apply a membership push (raises StaleMembership); drops cached metric children of removed replicas."""
        changes = self.replicas.apply(membership)
        if self.config.membership_file:
            save_membership(self.config.membership_file, membership)
        if self.kv_events is not None:
            self.kv_events.follow(membership.replicas)
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
        if self.kv_events is None:
            pulled = await self._pull_picture()
            self.health.start()
            self.kv_events = KvEventSubscriber(self.policy.on_cache_evicted, known=lambda rid: rid in self.replicas.by_id,
                                               bind_endpoint=self.config.kv_events_endpoint)
            self.kv_events.start()
            if self.config.membership_file and self.picture is None:
                self.picture = PictureKeeper(self, picture_path(self.config.membership_file),
                                             self.config.picture_save_s)
                self.picture.restore()  # before following: the saved sequence numbers say where replay resumes
                self.picture.start()
            if pulled is not None:
                n = apply_picture(self, pulled, "peers' picture")
                _log.info("picture of %d replicas restored from peers %s", n, ", ".join(self.config.picture_peers))
            self.kv_events.follow(m.member for m in self.replicas.by_id.values())
            if self.sharer is None and self.config.picture_peers and self.config.picture_share_s > 0:
                self.sharer = PictureSharer(self)
                self.sharer.seed(pulled.get("shared_from", {}) if pulled is not None else {})
                self.sharer.start()
        else:
            self.health.start()

    async def _pull_picture(self) -> dict | None:
        """With `picture_peers` and no picture file: the peers' merged picture (`picture_store.pull_picture`);
        a router without membership applies the newest membership answered (not followed yet: `start` follows after the
        picture set the sequence numbers)."""
        cfg = self.config
        if not cfg.picture_peers or (cfg.membership_file and picture_path(cfg.membership_file).exists()):
            return None
        doc = await pull_picture(cfg.picture_peers, cfg.admin_key, cfg.picture_peer_timeout_s)
        if doc is None:
            _log.warning("no picture peer answered (%s): starting with an empty picture",
                         ", ".join(cfg.picture_peers))
            return None
        if self.replicas.version is None and doc.get("membership"):
            try:
                self.apply_membership(Membership.model_validate(doc["membership"]))
            except ValidationError as e:
                _log.warning("the peers' membership is not valid (%s): not used", e)
        return doc

    async def stop(self) -> None:
        await self.health.stop()
        if self.sharer is not None:
            await self.sharer.stop()
            self.sharer = None
        if self.picture is not None:
            await self.picture.stop()
            self.picture = None
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
        if self.draining and scope["type"] == "http":
            send = closing_connection(send)  # no connection outlives the drain idle: none is cut while reused
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
        body = error_body(err.message, err.kind, err.status, err.param)
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
            raw, body, chat_prompt = await self._read_body(endpoint, headers, receive)
            ctx = self._context(endpoint, body, headers, chat_prompt)
        except HttpError as e:
            await self._respond_error(send, e)
            return
        except Exception as e:  # a bug, not the client's fault: still answered in the one error shape
            _log.exception("request failed before routing")
            await self._respond_error(send, HttpError(500, f"internal router error: {type(e).__name__}: {e}",
                                                      "server_error"))
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
            await self._forward(endpoint, send, raw, body, ctx, t0, state)
        except asyncio.CancelledError:
            if not state.disconnected:
                raise
            task.uncancel()  # type: ignore[union-attr]  the client left; nothing more to send
        except Exception as e:
            _log.exception("request %s failed", ctx.request_id)
            try:  # answered in the one error shape unless the response already started (then it is cut)
                await self._respond_error(send, HttpError(500, f"internal router error: {type(e).__name__}: {e}",
                                                          "server_error"))
            except RuntimeError:
                raise e from None
        finally:
            state.finished = True
            watcher.cancel()

    async def _read_body(
        self, endpoint: str, headers: dict, receive: Callable
    ) -> tuple[bytes, dict, TextChain | None]:
        """The raw body (forwarded as it is), its parsed JSON object and, for a chat body, the prompt's chain (the
        object then lacks `messages`; `chat_prefixes` parses only what extends the session's last body)."""
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
        if endpoint == "chat":
            session = headers.get(b"x-session-id")
            parsed = self.chat_prefixes.parse(raw, session.decode("latin-1") if session else None)
            if parsed is not None:
                return raw, parsed.fields, parsed.prompt
        try:
            body = parse_json_body(raw, self.config.max_json_depth, self.config.max_number_chars)
        except RequestError as e:
            raise HttpError(400, e.message) from None
        if not isinstance(body, dict):
            raise HttpError(400, "the JSON body must be an object")
        return raw, body, None

    def _model_label(self, model: str) -> str:
        """The model as a metric label: clients choose it freely when no model list is configured, so then
        it is "unlisted" (bounded label cardinality)."""
        return model if model in self.default_models or model in self.replicas.models() else "unlisted"

    def served_models(self) -> set[str]:
        return set(self.default_models) | self.replicas.models()

    def _context(
        self, endpoint: str, body: dict, headers: dict, chat_prompt: TextChain | None = None
    ) -> RequestContext:
        rid = headers.get(b"x-request-id")
        session = headers.get(b"x-session-id")
        try:
            check_sampling(endpoint, body)
        except RequestError as e:
            raise HttpError(400, e.message, param=e.param) from None
        try:
            ctx = context_from_openai(
                endpoint,  # type: ignore[arg-type]
                body,
                request_id=rid.decode("latin-1") if rid else f"{self._id_prefix}{next(self._ids)}",
                session_header=session.decode("latin-1") if session else None,
                slo_class=slo_class_from_headers(headers),
                block_tokens=self.config.block_tokens,
                chat_prompt=chat_prompt,
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
            probe = self.replicas.probe_target(ctx.model, self.default_models, tried)
            if probe is not None and not probe.view.saturated and (
                    probe.member.max_context_tokens is None or ctx.prompt_tokens <= probe.member.max_context_tokens):
                return _Attempt(probe, RoutingDecision(probe.id, "probe"), 0, probe=True)
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
        v = a.st.view
        self.load_ledger.admit(ctx, a.decision, v, a.cached_tokens)
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
        self.load_ledger.release(ctx, v, a.cached_tokens, prefilled=a.prefilled, ok=ok)
        if not a.st.removed:
            self._lab(self.metrics.active_requests, a.st.id).set(v.active_requests)
        self._wake()

def build_router(
    config: RouterConfig,
    *,
    membership: Membership | None = None,
    policy: Policy | None = None,
    registry: CollectorRegistry | None = None,
) -> Router:
    """A router with its own registry, policy and replica set (nothing shared between instances)."""
    return Router(config, policy=policy, registry=registry, membership=membership)
