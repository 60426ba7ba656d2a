"""A minimal OpenAI-compatible engine for cluster tests that accepts `vllm serve`'s command line.

Used with `--engine vllm` and a launcher of `[python, fake_engine.py]`, so the real vLLM adapter builds its argv
and the controller's whole path runs, without vLLM's 30 s start. Completions take ZOE_FAKE_DELAY_S seconds;
/metrics speaks vLLM's names for running requests.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

DELAY_S = float(os.environ.get("ZOE_FAKE_DELAY_S", "0.05"))
running = 0


def build(served: str, pid: int) -> Starlette:
    async def health(request):
        return PlainTextResponse("")

    async def completions(request):
        global running
        body = await request.json()
        running += 1
        try:
            await asyncio.sleep(DELAY_S)
        finally:
            running -= 1
        text = f"pid={pid}"
        choice = {"index": 0, "finish_reason": "length"}
        if request.url.path.endswith("chat/completions"):
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return JSONResponse({"id": f"cmpl-{time.time_ns()}", "object": "text_completion", "model": body.get("model", served),
                             "choices": [choice], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": served, "object": "model"}]})

    async def metrics(request):
        labels = f'{{engine="0",model_name="{served}"}}'
        return PlainTextResponse(f"vllm:num_requests_running{labels} {running}\nvllm:num_requests_waiting{labels} 0\n")

    return Starlette(routes=[
        Route("/health", health), Route("/v1/models", models), Route("/metrics", metrics),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", completions, methods=["POST"]),
    ])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cmd")
    p.add_argument("model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--served-model-name", default="fake")
    a, _ = p.parse_known_args()
    uvicorn.run(build(a.served_model_name, os.getpid()), host=a.host, port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
