"""The simulated engine's HTTP surface: an OpenAI-compatible server backed by `EngineCore` on a wall clock.

Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (streaming with SSE and not; `usage` with
`prompt_tokens_details.cached_tokens`; `stream_options.include_usage`; vLLM's `return_token_ids` and, for chat,
`continue_final_message`, which the router's mid-stream migration uses), `GET /v1/models`, `GET /health`
(503 while the weights "load"), `GET /metrics` (`zoe_cluster.sim.metrics`), `POST /reset_prefix_cache` (as
vLLM), and the simulator's own `GET /sim/info` (calibration, KV capacity) and, only when started with
`fault_endpoint` (`zoe sim serve --fault-endpoint`), `POST /sim/faults`.

Every request generates exactly `max_tokens` tokens (there is no end-of-sequence; finish_reason "length").
Errors look like vLLM's: `{"error": {"message", "type", "param", "code"}}` with 400 (bad request: JSON nested
too deep or with an over-long number, sampling parameters vLLM rejects, checked by the router's own
`request_checks`; a prompt too long for the context, naming the limit), 404 (unknown model), 413 (a body over
`max_body_bytes`), 500 (injected fault), 503 (still starting).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from zoe_cluster.engines.vllm import VllmAdapter
from zoe_cluster.recipes import Recipe
from zoe_cluster.router.request_checks import RequestError, check_sampling, parse_json_body
from zoe_cluster.routing.context import DEFAULT_MAX_TOKENS
from zoe_cluster.sim.calibrate import Calibration, calibrate
from zoe_cluster.sim.clock import WallClock
from zoe_cluster.sim.core import EngineCore, RequestTooLarge, SimRequest
from zoe_cluster.sim.faults import FaultConfig, FaultState
from zoe_cluster.sim.kv_cache import PrefixCache, host_kv_tier, kv_capacity
from zoe_cluster.sim.load_time import LoadTime, load_s
from zoe_cluster.sim.metrics import MetricsMode, SimMetrics
from zoe_cluster.sim.tokens import OutputText, prompt_blocks, render_chat

SERVER_BLOCK_TOKENS = 16


@dataclass
class ServerConfig:
    """How one `zoe sim serve` process behaves."""

    served_model_name: str
    time_scale: float = 1.0
    """Real seconds per simulated second (0.01: 100x faster than the modelled hardware)."""
    seed: int = 0
    load_time: LoadTime = "fast"
    """How long the simulated weights load takes: `fast` (FAST_LOAD_S) or `real` (profile.weights_load_s)."""
    startup_s: float | None = None
    """Simulated start-up time (weights load), overriding `load_time`; None: as `load_time` says."""
    metrics_mode: MetricsMode = VllmAdapter.name
    max_model_len: int | None = None
    """Longest prompt + output, tokens; None: the model's max_context_tokens."""
    kv_tokens: int | None = None
    """KV capacity override, tokens (tests); None: computed from the recipe."""
    host_kv_gb: float = 0.0
    """Host memory for a second KV tier, GB per replica (vLLM's `--kv-offloading-size`, SGLang's HiCache);
    0: HBM only. Sized and priced by `sim.kv_cache.host_kv_tier`."""
    block_tokens: int = SERVER_BLOCK_TOKENS
    faults: FaultConfig | None = None
    fault_endpoint: bool = False
    """Serve `POST /sim/faults` (unauthenticated fault injection at run time): tests and fault benchmarks only."""
    max_body_bytes: int = 32 * 1024 * 1024
    """Larger request bodies get 413."""


def token_ids(prompt: str | list[int]) -> list[int]:
    """Token ids of a prompt or an output (`return_token_ids`): a token-id prompt as it is; text as one id per
    4-character token (`sim.tokens`), derived from the characters, so a continuation prompt made of a prompt's
    and an output's ids has the same token count as the text it stands for."""
    if not isinstance(prompt, str):
        return list(prompt)
    return [zlib.crc32(prompt[i:i + 4].encode()) & 0xFFFF for i in range(0, len(prompt), 4)]


class _HttpError(Exception):
    def __init__(self, status: int, message: str, etype: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.etype, self.param = status, message, etype, param


def _error(status: int, message: str, etype: str, param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": etype, "param": param, "code": status}}, status)


async def _route_error(request: Request, exc: Exception) -> JSONResponse:
    status = getattr(exc, "status_code", 404)
    return _error(status, f"{request.method} {request.url.path}: {getattr(exc, 'detail', 'no such route')}",
                  "NotFoundError" if status == 404 else "BadRequestError")


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    return _error(500, f"internal error: {type(exc).__name__}: {exc}", "InternalServerError")


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A parsed and checked request, ready for the engine."""

    prompt_tokens: int
    hashes: tuple[int, ...]
    max_tokens: int
    stream: bool
    include_usage: bool
    prompt_ids: list[int] | None


class _Flow:
    """Per-request channel from the engine loop to the HTTP handler."""

    __slots__ = ("queue", "number", "text", "started")

    def __init__(self, number: int, seed: int) -> None:
        self.started = False
        self.queue: asyncio.Queue[int] = asyncio.Queue()
        self.number = number
        self.text = OutputText(seed, number)


class SimServer:
    """One simulated replica: engine loop + HTTP app. Build with `SimServer(recipe, variant, config)` and serve
    `server.app` with uvicorn."""

    def __init__(self, recipe: Recipe, variant: str, config: ServerConfig, calibration: Calibration | None = None):
        self.recipe, self.variant, self.config = recipe, variant, config
        v = recipe.variant(variant)
        self.calibration = calibration or calibrate(recipe, variant, block_tokens=config.block_tokens)
        cap = kv_capacity(recipe, variant)
        kv_tokens = config.kv_tokens or cap.tokens
        self.capacity = cap
        self.max_model_len = config.max_model_len or recipe.architecture.max_context_tokens
        self.host_tier = host_kv_tier(recipe, variant, config.host_kv_gb)
        cache = PrefixCache(max(1, kv_tokens // config.block_tokens), config.block_tokens,
                            self.host_tier.tokens // config.block_tokens, self.host_tier.load_s_per_token)
        self.core = EngineCore.for_variant(self.calibration.model, cache, v)
        self.metrics = SimMetrics(config.metrics_mode, config.served_model_name)
        self.faults = FaultState(config.faults or FaultConfig(), config.seed)
        self.startup_s = load_s(recipe, variant, config.load_time) if config.startup_s is None else config.startup_s
        self.clock = WallClock(config.time_scale)
        self._ready_at = self.startup_s
        self._wake = asyncio.Event()
        self._healed = asyncio.Event()
        self._engine_t = 0.0
        self._latest_arrival = 0.0
        self._numbers = 0
        self._task: asyncio.Task | None = None
        self.app = Starlette(
            routes=[
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/health", self._health, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"]),
                Route("/reset_prefix_cache", self._reset_cache, methods=["POST"]),
                Route("/sim/info", self._info, methods=["GET"]),
                *([Route("/sim/faults", self._set_faults, methods=["POST"])] if config.fault_endpoint else []),
            ],
            lifespan=self._lifespan,
            exception_handlers={404: _route_error, 405: _route_error, 500: _internal_error},
        )

    # --- engine loop ----------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.clock = WallClock(self.config.time_scale)
        self._wake = asyncio.Event()
        self._healed = asyncio.Event()
        self._task = asyncio.create_task(self._loop())
        try:
            yield
        finally:
            self._task.cancel()

    @property
    def ready(self) -> bool:
        return self.clock.now() >= self._ready_at

    async def _loop(self) -> None:
        core, clock, metrics = self.core, self.clock, self.metrics
        while True:
            if self.faults.hung:
                await self._healed.wait()
                continue
            if not core.has_work:
                self._wake.clear()
                await self._wake.wait()
                continue
            # Engine time runs ahead of the wall clock by whole steps; it never starts a step before a request
            # in it arrived, and jumps forward after idle time.
            start = max(self._engine_t, self._latest_arrival)
            step = core.schedule(start)
            if step is None:  # nothing fits right now (cannot happen with a consistent cache); back off
                await clock.sleep(0.01)
                self._engine_t = clock.now()
                continue
            dur = step.duration_s * self.faults.config.slowdown
            end = start + dur
            await clock.sleep_until(end)
            if self.faults.hung:
                continue
            self._engine_t = end
            for req, n in core.complete(step, end):
                flow: _Flow = req.payload
                if not flow.started:
                    flow.started = True
                    metrics.first_token(end - req.arrival_s + core.model.frontend_s)
                else:
                    metrics.step_output(dur)
                if req.finish_s is not None:
                    metrics.finished(req, end - req.arrival_s + core.model.frontend_s)
                flow.queue.put_nowait(n)
            metrics.sync(core)

    # --- request parsing ------------------------------------------------------------------------------
    async def _raw_body(self, request: Request) -> bytes:
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise _HttpError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _HttpError(413, f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def _body(self, raw: bytes, chat: bool) -> dict[str, Any]:
        try:
            body = parse_json_body(raw, max_depth=128, max_number_chars=100)
        except RequestError as e:
            raise _HttpError(400, e.message) from None
        if not isinstance(body, dict):
            raise _HttpError(400, "request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise _HttpError(400, "'model' is required and must be a string")
        if model != self.config.served_model_name:
            raise _HttpError(404, f"The model `{model}` does not exist.", "NotFoundError")
        try:
            check_sampling("chat" if chat else "completions", body)
        except RequestError as e:
            raise _HttpError(400, e.message, param=e.param) from None
        return body

    def _max_tokens(self, body: dict[str, Any], prompt_tokens: int) -> int:
        mt = body.get("max_completion_tokens", body.get("max_tokens"))
        if mt is None:
            mt = DEFAULT_MAX_TOKENS
        if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
            raise _HttpError(400, "'max_tokens' must be a positive integer")
        if prompt_tokens + mt > self.max_model_len:
            raise _HttpError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{prompt_tokens + mt} tokens ({prompt_tokens} in the messages, {mt} in the completion). Please "
                "reduce the length of the messages or completion.",
            )
        n = body.get("n", 1)
        if n != 1:
            raise _HttpError(400, "'n' must be 1 on the simulated engine")
        return mt

    def _admit_fault(self) -> None:
        what = self.faults.on_request()
        if what == "crash":
            os._exit(3)
        if what == "error":
            raise _HttpError(500, "injected fault: engine error", "InternalServerError")

    async def _start(self, prompt_tokens: int, hashes: tuple[int, ...], max_tokens: int) -> SimRequest:
        if self.faults.hung:
            await self._healed.wait()
        if prompt_tokens <= 0:
            raise _HttpError(400, "the prompt is empty")
        self._numbers += 1
        flow = _Flow(self._numbers, self.config.seed)
        await self.clock.sleep(self.core.model.frontend_s)
        now = self.clock.now()
        req = SimRequest(f"sim-{uuid.uuid4().hex[:16]}", prompt_tokens, max_tokens, hashes, arrival_s=now,
                         payload=flow)
        try:
            self.core.add(req)
        except RequestTooLarge as e:
            raise _HttpError(400, str(e)) from None
        self._latest_arrival = max(self._latest_arrival, now)
        self._wake.set()
        return req

    def _prepare(self, raw: bytes, chat: bool) -> _Prepared:
        """Everything a request needs before it reaches the engine: JSON parsing, checks, chat rendering, block
        hashing, token ids. Runs in a worker thread (`_handle`), as vLLM's API server tokenizes off its event loop,
        so /health and streaming stay responsive while a 100-600 KB prompt is prepared; it reads only the
        immutable config."""
        body = self._body(raw, chat)
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise _HttpError(400, "'messages' must be a non-empty list")
            if body.get("continue_final_message") and body.get("add_generation_prompt"):  # as vLLM
                raise _HttpError(400, "Cannot set both `continue_final_message` and `add_generation_prompt` "
                                      "to True.")
            try:
                text = render_chat(messages, body.get("tools"))
            except ValueError as e:
                raise _HttpError(400, str(e)) from None
            prompt_tokens, hashes = prompt_blocks(text, self.config.block_tokens)
            prompt = text
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]
            elif isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
                raise _HttpError(400, f"the simulated engine serves one prompt per request, got a batch of "
                                      f"{len(prompt)}", param="prompt")
            if isinstance(prompt, str):
                pass
            elif isinstance(prompt, list) and prompt and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt
            ):
                pass
            else:
                raise _HttpError(400, "'prompt' is required: a string or a list of token ids")
            prompt_tokens, hashes = prompt_blocks(prompt, self.config.block_tokens)
        if prompt_tokens <= 0:
            raise _HttpError(400, "the prompt is empty")
        max_tokens = self._max_tokens(body, prompt_tokens)
        stream = bool(body.get("stream", False))
        opts = body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
        prompt_ids = token_ids(prompt) if body.get("return_token_ids") else None
        return _Prepared(prompt_tokens, hashes, max_tokens, stream, include_usage, prompt_ids)

    async def _handle(self, request: Request, chat: bool) -> Response:
        try:
            if not self.ready:
                raise _HttpError(503, "the engine is still loading weights", "ServiceUnavailableError")
            raw = await self._raw_body(request)
            prep = await asyncio.to_thread(self._prepare, raw, chat)
            self._admit_fault()
            req = await self._start(prep.prompt_tokens, prep.hashes, prep.max_tokens)
        except _HttpError as e:
            return _error(e.status, e.message, e.etype, e.param)
        stream, include_usage, prompt_ids = prep.stream, prep.include_usage, prep.prompt_ids
        model = self.config.served_model_name
        rid = ("chatcmpl-" if chat else "cmpl-") + req.request_id[4:]
        created = int(time.time())
        if stream:
            return StreamingResponse(
                self._sse(req, chat, rid, created, model, include_usage, prompt_ids), media_type="text/event-stream"
            )
        flow: _Flow = req.payload
        parts = []
        while req.output < req.max_tokens or not flow.queue.empty():
            n = await flow.queue.get()
            parts.append(flow.text.next(n))
        text = "".join(parts)
        usage = self._usage(req)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": "length", "stop_reason": None}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
            obj = "text_completion"
        if prompt_ids is not None:
            choice.update(prompt_token_ids=prompt_ids, token_ids=token_ids(text))
        payload = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice], "usage": usage}
        if prompt_ids is not None:  # encoding every prompt token id is long work: off the loop, as `_prepare`
            return await asyncio.to_thread(JSONResponse, payload)
        return JSONResponse(payload)

    def _usage(self, req: SimRequest) -> dict[str, Any]:
        return {
            "prompt_tokens": req.prompt_tokens,
            "completion_tokens": req.output,
            "total_tokens": req.prompt_tokens + req.output,
            # as vLLM's num_cached_tokens: local prefix hits plus tokens a KV connector (the host tier) loaded
            "prompt_tokens_details": {"cached_tokens": max(0, req.cached_tokens) + req.host_cached_tokens},
        }

    async def _sse(self, req: SimRequest, chat: bool, rid: str, created: int, model: str,
                   include_usage: bool, prompt_ids: list[int] | None = None) -> AsyncIterator[bytes]:
        flow: _Flow = req.payload
        obj = "chat.completion.chunk" if chat else "text_completion"
        ids_asked = prompt_ids is not None

        def chunk(choice: dict[str, Any] | None, usage: dict[str, Any] | None = None, **top: Any) -> bytes:
            payload: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model,
                                       "choices": [choice] if choice is not None else [], **top}
            if usage is not None:
                payload["usage"] = usage
            return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

        try:
            if chat:
                opening = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                           "finish_reason": None}
                if prompt_ids is not None:  # as vLLM: the prompt's ids on the first chunk, then each chunk's own
                    yield chunk(opening, prompt_token_ids=prompt_ids)
                    prompt_ids = None
                else:
                    yield chunk(opening)
            done = 0
            while done < req.max_tokens:
                n = await flow.queue.get()
                done += n
                text = flow.text.next(n)
                last = done >= req.max_tokens
                fin = "length" if last else None
                if chat:
                    choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": fin}
                else:
                    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": fin, "stop_reason": None}
                if ids_asked:
                    if prompt_ids is not None:
                        choice["prompt_token_ids"], prompt_ids = prompt_ids, None
                    choice["token_ids"] = token_ids(text)
                yield chunk(choice)
            if include_usage:
                yield chunk(None, self._usage(req))
            yield b"data: [DONE]\n\n"
        finally:
            if req.finish_s is None:
                self.core.abort(req)
                self.metrics.sync(self.core)

    # --- other endpoints ------------------------------------------------------------------------------
    async def _completions(self, request: Request) -> Response:
        return await self._handle(request, chat=False)

    async def _chat(self, request: Request) -> Response:
        return await self._handle(request, chat=True)

    async def _models(self, request: Request) -> Response:
        v = self.recipe.variant(self.variant)
        return JSONResponse({"object": "list", "data": [{
            "id": self.config.served_model_name, "object": "model", "created": 0, "owned_by": "zoe-sim",
            "root": v.weights.repo, "parent": None, "max_model_len": self.max_model_len,
        }]})

    async def _health(self, request: Request) -> Response:
        if self.faults.hung:
            await self._healed.wait()
        if not self.ready:
            return Response("loading weights", status_code=503)
        return Response(status_code=200)

    async def _metrics(self, request: Request) -> Response:
        if self.faults.hung:
            await self._healed.wait()
        self.metrics.sync(self.core)
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def _reset_cache(self, request: Request) -> Response:
        self.core.cache.reset()
        return Response(status_code=200)

    async def _info(self, request: Request) -> Response:
        return JSONResponse({
            "model": self.recipe.name, "variant": self.variant, "served_model_name": self.config.served_model_name,
            "time_scale": self.config.time_scale, "seed": self.config.seed, "load_time": self.config.load_time, "startup_s": self.startup_s,
            "ready": self.ready, "max_model_len": self.max_model_len,
            "kv_capacity_tokens": self.core.cache.num_blocks * self.core.cache.block_tokens,
            "kv_capacity": self.capacity.explain(), "block_tokens": self.core.cache.block_tokens,
            "host_kv_capacity_tokens": self.host_tier.tokens,
            "host_kv": self.host_tier.explain() if self.host_tier.tokens else None,
            "calibration": self.calibration.to_dict(), "faults": self.faults.config.model_dump(),
            "requests": self.faults.requests, "metrics_mode": self.config.metrics_mode,
        })

    async def _set_faults(self, request: Request) -> Response:
        try:
            data = await request.json()
            cfg = FaultConfig.model_validate({**self.faults.config.model_dump(), **data})
        except (json.JSONDecodeError, ValueError, TypeError) as e:
            return _error(400, f"bad fault config: {e}", "BadRequestError")
        self.faults.config = cfg
        if self.faults.hung and cfg.hang_after is None:  # healed: everything waiting goes on
            self.faults.hung = False
            self._healed.set()
            self._healed = asyncio.Event()
            self._wake.set()
        return JSONResponse(cfg.model_dump())
