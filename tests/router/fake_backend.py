"""A FAKE OpenAI backend for the router's proxy-mechanics tests (not an engine: no model, no tokens).

Each instance answers /health, /metrics, /v1/models, /v1/completions and /v1/chat/completions. Its behaviour is
set by `mode` and can be changed while it runs:
  ok        answers at once (streams `chunks` SSE events `interval_s` apart when "stream": true)
  fail503   answers 503
  hang      accepts the request and never answers
  die       streams 2 events and then drops the connection (a replica dying mid-stream)
  unhealthy requests work but /health answers 500
  fail500   answers 500 with a plain-text body (an engine's unhandled exception)
  stall     streams 2 events and then sends nothing more, keeping the connection open (a hung engine)
It records the requests it saw and how many streams the client side abandoned (`cancelled`).

`ServerThread` runs any ASGI app with uvicorn in a background thread on a loopback port (with the router's
hardened protocol, `zoe_cluster.router.http_server`, when given `http=`); stop() joins it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from tests.conftest import free_port


class FakeBackend:
    def __init__(self, name: str, mode: str = "ok", chunks: int = 3, interval_s: float = 0.0):
        self.name, self.mode, self.chunks, self.interval_s = name, mode, chunks, interval_s
        self.seen: list[dict] = []
        self.cancelled = 0
        self.app = Starlette(
            routes=[
                Route("/health", self.health),
                Route("/metrics", self.metrics),
                Route("/v1/models", self.models),
                Route("/v1/completions", self.complete, methods=["POST"]),
                Route("/v1/chat/completions", self.complete, methods=["POST"]),
            ]
        )

    async def health(self, request: Request):
        return PlainTextResponse("", status_code=500 if self.mode in ("unhealthy", "hang") else 200)

    async def metrics(self, request: Request):
        return PlainTextResponse(
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="m"}} {len(self.seen)}\n'
            "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 0\n"
        )

    async def models(self, request: Request):
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def complete(self, request: Request):
        body = await request.json()
        self.seen.append(body)
        if self.mode == "fail503":
            return JSONResponse({"error": "overloaded"}, status_code=503)
        if self.mode == "fail500":
            return PlainTextResponse("Internal Server Error", status_code=500)
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if not body.get("stream"):
            return JSONResponse({"id": "x", "object": "text_completion", "backend": self.name,
                                 "choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}]})
        die, stall = self.mode == "die", self.mode == "stall"
        n, interval = self.chunks, self.interval_s

        async def events():
            try:
                for i in range(n):
                    if die and i == 2:
                        raise ConnectionResetError("fake backend dies mid-stream")
                    if stall and i == 2:
                        await asyncio.sleep(3600)
                    yield f"data: {json.dumps({'backend': self.name, 'i': i, 't': time.time()})}\n\n"
                    if interval:
                        await asyncio.sleep(interval)
                yield "data: [DONE]\n\n"
            except (asyncio.CancelledError, GeneratorExit):
                self.cancelled += 1
                raise

        return StreamingResponse(events(), media_type="text/event-stream")


class ServerThread:
    """uvicorn serving `app` on 127.0.0.1:<port> in a thread (with lifespan)."""

    def __init__(self, app, port: int | None = None, http="auto"):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="critical", lifespan="on",
                             timeout_graceful_shutdown=0.5, access_log=False, http=http)
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> "ServerThread":
        self.thread.start()
        deadline = time.time() + 10
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
