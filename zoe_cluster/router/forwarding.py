"""Sending one request upstream and relaying the answer: the part of `Router` between admission and the client.

`Forwarding` is a mixin of `Router` (`router.app`): it uses the router's admission (`_acquire`, `_admit`,
`_release`, `load_ledger`), replica set, metrics and upstream pool. Per attempt: open the request on the chosen
replica (a stall watch on the response headers), then either read a whole body, or relay a stream event by event;
a failure before any byte reached the client is retried on another replica (`_forward`), a stream that breaks after
that continues on another replica (`_migrate`, `router.migration`) or ends with an error event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from zoe_cluster.router.errors import HttpError, upstream_error_body
from zoe_cluster.router.migration import (
    EngineErrorEvent,
    NotContinuable,
    SpliceRewriter,
    StreamLedger,
    ask_token_ids,
    chat_by_token_ids,
    continuable,
    continuation_body,
    final_usage_event,
)
from zoe_cluster.router.replicas import RoutedReplica
from zoe_cluster.router.slowness import stall_verdict
from zoe_cluster.router.stall_watch import StallWatch
from zoe_cluster.router.upstream import UpstreamResponse
from zoe_cluster.routing.context import RequestContext, RoutingDecision

_log = logging.getLogger(__name__)
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*([0-9]+)')
_SSE_HEADERS = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


class _UpstreamFailed(Exception):
    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind


@dataclass
class _Attempt:
    st: RoutedReplica
    decision: RoutingDecision
    cached_tokens: int
    prefilled: bool = False
    """The first streamed chunk arrived (the request's prefill left the replica's queue)."""
    probe: bool = False
    """A recovery probe of a replica judged slow (its latency sample replaces the replica's average)."""


class Forwarding:
    """`Router`'s upstream half (a mixin; see the module docstring)."""

    async def _forward(
        self, endpoint: str, send: Callable, raw: bytes, body: dict, ctx: RequestContext, t0: float, state
    ) -> None:
        cfg = self.config
        path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
        up_headers = {"content-type": "application/json", "x-request-id": ctx.request_id}
        payload, ledger = raw, None
        if body.get("stream") is True and cfg.migration_limit and continuable(body, endpoint) is None:
            ask = ("return_token_ids" not in body and ctx.prompt_tokens <= cfg.migration_token_ids_max_prompt
                   and (endpoint == "completions" or chat_by_token_ids(body)))
            if ask:
                payload = ask_token_ids(raw)
            ledger = StreamLedger(endpoint, strip_token_ids=ask)
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
            broken: str | None = None  # why the stream failed after the client's response started
            try:
                resp = await self._open(a, a.st.view.url + path, payload, up_headers)
                try:
                    if resp.status in self._retry_statuses and attempt_no < cfg.max_retries:
                        async with asyncio.timeout(cfg.read_timeout_s):
                            detail = (await resp.read())[:200].decode("utf-8", "replace")
                        raise _UpstreamFailed("status", f"HTTP {resp.status} from {a.st.id}: {detail}")
                    ctype = resp.headers.get("content-type", "")
                    if ctype.startswith("text/event-stream"):
                        broken = await self._stream(send, resp, ctx, a, t0, ledger.take if ledger else None)
                        ok = broken is None
                        if ok and ledger is not None and (rest := ledger.rest()):
                            await send({"type": "http.response.body", "body": rest, "more_body": True})
                    else:
                        async with asyncio.timeout(cfg.read_timeout_s):
                            data = await resp.read()
                        if resp.status >= 400:
                            data, ctype = upstream_error_body(resp.status, data, a.st.id), "application/json"
                        await self._send_whole(send, resp.status, ctype, data, a)
                        ok = resp.status < 500
                        e2e_s = time.perf_counter() - t0
                        self._lab(self.metrics.e2e, self._model_label(ctx.model)).observe(e2e_s)
                        if not ok:
                            self.replicas.record_failure(a.st, "status")
                        elif resp.status == 200 and (m := _COMPLETION_TOKENS.search(data, max(0, len(data) - 512))):
                            if (n := int(m.group(1))) > 0:
                                self.replicas.record_latency(a.st, "e2e_per_token_s", e2e_s / n, a.probe)
                finally:
                    resp.release() if ok else resp.close()
                if ok:
                    self.replicas.record_success(a.st)
                    if ctype.startswith("text/event-stream"):
                        await self._end_stream(send, state, ctx, t0)
                    return
            except _UpstreamFailed as e:
                last_error = str(e)
                self.replicas.record_failure(a.st, e.kind)
            except TimeoutError:  # before OSError: TimeoutError is one
                last_error = f"timeout waiting for {a.st.id}"
                self.replicas.record_failure(a.st, "timeout")
            except ValueError as e:  # a URL the upstream client cannot use: this replica fails, others may not
                last_error = f"{a.st.id}: {e}"
                self.replicas.record_failure(a.st, "connect")
            except OSError as e:  # refused, reset, closed early (UpstreamError)
                last_error = f"{type(e).__name__} from {a.st.id}: {e}"
                self.replicas.record_failure(a.st, "connect")
            finally:
                self._release(ctx, a, ok)
            if broken is not None:
                if ledger is not None:
                    broken = await self._migrate(endpoint, send, raw, ctx, ledger, tried, broken)
                if broken is None:
                    await self._end_stream(send, state, ctx, t0)
                    return
                msg = f"{broken}; the response is incomplete"
                event = json.dumps({"error": {"message": msg, "type": "upstream_error", "param": None, "code": 502}})
                state.finished = True
                await send({"type": "http.response.body", "body": f"data: {event}\n\ndata: [DONE]\n\n".encode(),
                            "more_body": False})
                self._lab(self.metrics.e2e, self._model_label(ctx.model)).observe(time.perf_counter() - t0)
                return
        await self._respond_error(send, HttpError(502, f"upstream failed: {last_error}", "upstream_error"))

    async def _end_stream(self, send: Callable, state, ctx: RequestContext, t0: float) -> None:
        state.finished = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self._lab(self.metrics.e2e, self._model_label(ctx.model)).observe(time.perf_counter() - t0)

    async def _migrate(self, endpoint: str, send: Callable, raw: bytes, ctx: RequestContext,
                       ledger: StreamLedger, tried: set[str], broken: str) -> str | None:
        """Continue a broken stream on other replicas (up to `migration_limit` continuations, see
        `router.migration`); None when the client's stream is complete, else why it is not."""
        ledger.settle()
        body = json.loads(raw)  # the whole body (a chat body's parsed fields lack `messages`)
        wants_ids = bool(body.get("return_token_ids"))
        want_ids = wants_ids or ledger.strip_token_ids
        up_headers = {"content-type": "application/json", "x-request-id": ctx.request_id}
        count = self.metrics.migrations.labels
        for n in range(1, self.config.migration_limit + 1):
            if ledger.output_ended:
                count("completed").inc()
                if not ledger.done:
                    end = final_usage_event(body, ledger) + b"data: [DONE]\n\n"
                    await send({"type": "http.response.body", "body": end, "more_body": True})
                return None
            try:
                kind, payload = continuation_body(body, endpoint, ledger, want_ids)
            except NotContinuable as e:
                count("not_continuable").inc()
                return f"{broken}; not continued: {e}"
            try:
                a = await self._acquire(ctx, tried)
            except HttpError as e:
                count("no_replica").inc()
                return f"{broken}; no replica to continue on: {e.message}"
            _log.warning("request %s: %s; continuing on %s after %d tokens (migration %d of at most %d)",
                         ctx.request_id, broken, a.st.id, ledger.generated_tokens, n, self.config.migration_limit)
            self._admit(ctx, a)
            tried.add(a.st.id)
            ok = False
            rewriter = SpliceRewriter(ledger, wants_ids, as_chat=endpoint != kind)
            path = "/v1/completions" if kind == "completions" else "/v1/chat/completions"
            try:
                resp = await self._open(a, a.st.view.url + path, payload, up_headers)
                try:
                    if resp.status != 200 or not resp.headers.get("content-type", "").startswith("text/event-stream"):
                        async with asyncio.timeout(self.config.read_timeout_s):
                            detail = (await resp.read())[:200].decode("utf-8", "replace")
                        raise _UpstreamFailed("status", f"HTTP {resp.status} from {a.st.id}: {detail}")
                    failed = await self._stream(send, resp, ctx, a, 0.0, rewriter.take, started=True)
                    ok = failed is None
                finally:
                    resp.release() if ok else resp.close()
                if ok:
                    if rest := rewriter.rest():
                        await send({"type": "http.response.body", "body": rest, "more_body": True})
                    self.replicas.record_success(a.st)
                    count("continued").inc()
                    return None
                broken = failed  # type: ignore[assignment]
            except _UpstreamFailed as e:
                broken = str(e)
                self.replicas.record_failure(a.st, e.kind)
            except TimeoutError:
                broken = f"timeout waiting for {a.st.id}"
                self.replicas.record_failure(a.st, "timeout")
            except (ValueError, OSError) as e:
                broken = f"{type(e).__name__} from {a.st.id}: {e}"
                self.replicas.record_failure(a.st, "connect")
            finally:
                self._release(ctx, a, ok)
            count("failed").inc()
        count("exhausted").inc()
        return f"{broken}; {self.config.migration_limit} continuations failed"

    async def _open(self, a: _Attempt, url: str, payload: bytes, headers: dict) -> UpstreamResponse:
        assert self.upstream is not None, "router not started (use the ASGI lifespan or await router.start())"
        watch = StallWatch(a.st, self.config.stall_timeout_s, self.config.first_byte_timeout_s, self.clock)
        try:
            async with watch:
                return await self.upstream.request("POST", url, payload, headers)
        except TimeoutError:
            if watch.stalled:
                raise _UpstreamFailed("stall", f"{a.st.id} is hung: none of its streams sent a byte for "
                                               f"{self.config.stall_timeout_s:g} s") from None
            raise

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
                      t0: float, take: Callable[[bytes], bytes] | None = None, started: bool = False) -> str | None:
        """Pass an SSE body through chunk by chunk (through `take` when given: whole events, rewritten); None when
        it ended cleanly, else what failed mid-stream (recorded against the replica; the client's stream stays
        open for the caller to continue or end). `started`: the client's response already began (a
        continuation). Failing before the first chunk raises, so the request can be retried."""
        # Wait for the first chunk before answering, so a replica that fails before any byte can be retried.
        cfg, st = self.config, a.st
        watch = StallWatch(st, cfg.stall_timeout_s, cfg.first_byte_timeout_s, self.clock)
        try:
            async with watch:
                first = await resp.readany()
        except TimeoutError:
            if watch.stalled:
                raise _UpstreamFailed("stall", f"{st.id} is hung: none of its streams sent a byte for "
                                               f"{cfg.stall_timeout_s:g} s") from None
            raise
        if not first:
            raise _UpstreamFailed("midstream", f"{a.st.id} closed the stream before any event")
        if not started:
            headers = [
                (b"content-type", b"text/event-stream"),
                (b"x-zoe-replica", a.st.id.encode()),
                (b"x-zoe-route-reason", a.decision.reason.encode()),
                *_SSE_HEADERS,
            ]
            await send({"type": "http.response.start", "status": resp.status, "headers": headers})
            self._lab(self.metrics.ttft, self._model_label(ctx.model)).observe(time.perf_counter() - t0)
            self._lab(self.metrics.responses, str(resp.status)).inc()
        error = None
        try:
            data = take(first) if take is not None else first
        except EngineErrorEvent as e:
            data, error = e.before, e.message
        if data or not started:
            await send({"type": "http.response.body", "body": data, "more_body": True})
        self.load_ledger.prefill_done(ctx, a.st.view, a.cached_tokens)
        a.prefilled = True
        clock = self.clock
        first_at = resp.arrived_at  # arrival times, so a client that reads slowly does not slow the replica's figure
        last_at = st.last_byte_at = clock()
        st.hung = False
        events = first.count(b"data: ")
        st.decoding_streams += 1
        try:
            kind = None if error is None else "error_event"
            detail = error
            while kind is None:
                try:
                    async with asyncio.timeout(min(cfg.stall_timeout_s, cfg.read_timeout_s)):
                        chunk = await resp.readany()
                except TimeoutError:
                    now = clock()
                    verdict = stall_verdict(now, last_at, st.last_byte_at, st.decoding_streams, cfg.stall_timeout_s,
                                            cfg.read_timeout_s, st.hung)
                    if verdict == "wait":
                        continue
                    kind = "stall" if verdict == "stalled" else "timeout"
                    detail = f"no byte for {now - last_at:.1f} s"
                    break
                if not chunk:
                    break
                last_at = st.last_byte_at = clock()
                events += chunk.count(b"data: ")
                if take is not None:
                    try:
                        chunk = take(chunk)
                    except EngineErrorEvent as e:
                        chunk, kind, detail = e.before, "error_event", e.message
                    if not chunk:
                        continue
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except OSError as e:  # UpstreamError
            kind, detail = "midstream", type(e).__name__
        finally:
            st.decoding_streams -= 1
        if kind is not None:
            self.replicas.record_failure(st, kind)
            return f"replica {st.id} failed mid-stream ({kind}: {detail})"
        if events >= 4:  # [DONE] and a usage event end most streams; the gaps between token events remain
            self.replicas.record_latency(st, "tpot_s", (resp.arrived_at - first_at) / (events - 1), a.probe)
        return None
