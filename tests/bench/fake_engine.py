"""A FAKE engine for the bench tests (not zoe's simulated engine): OpenAI streaming, /tokenize, and vLLM's
prefix-cache counters over a real block cache of whitespace words (1 word = 1 token, 16-token blocks).
TTFT = 2 ms + 100 us per uncached token; each further token 3 ms; streams do not slow each other down.

Run: python -m tests.bench.fake_engine PORT
"""

from __future__ import annotations

import asyncio
import json
import sys

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

BLOCK = 16
MODEL = "fake-model"
cache: set[tuple[str, ...]] = set()
counters = {"queries": 0, "hits": 0}


def admit(words: list[str]) -> int:
    """Cached tokens of a prompt (whole blocks of a matching prefix); caches all of its full blocks."""
    hits, matching = 0, True
    for end in range(BLOCK, len(words) + 1, BLOCK):
        key = tuple(words[:end])
        if matching and key in cache and end < len(words):
            hits = end
        else:
            matching = False
        cache.add(key)
    counters["queries"] += len(words)
    counters["hits"] += hits
    return hits


async def models(_: Request):
    return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


async def tokenize(request: Request):
    body = await request.json()
    return JSONResponse({"count": len(body["prompt"].split())})


async def metrics(_: Request):
    text = (
        "# TYPE vllm:prefix_cache_queries_total counter\n"
        f'vllm:prefix_cache_queries_total{{engine="0",model_name="{MODEL}"}} {counters["queries"]}\n'
        "# TYPE vllm:prefix_cache_hits_total counter\n"
        f'vllm:prefix_cache_hits_total{{engine="0",model_name="{MODEL}"}} {counters["hits"]}\n'
    )
    return PlainTextResponse(text)


async def generate(request: Request):
    body = await request.json()
    if body.get("model") != MODEL:
        return JSONResponse({"error": {"message": f"model {body.get('model')!r} not found"}}, status_code=404)
    chat = "messages" in body
    prompt = " ".join(m["content"] for m in body["messages"]) if chat else body["prompt"]
    words = prompt.split()
    cached = admit(words)
    n_out = int(body.get("max_tokens", 16))

    async def stream():
        await asyncio.sleep(0.002 + 1e-4 * (len(words) - cached))
        for i in range(n_out):
            if i:
                await asyncio.sleep(0.003)
            choice = {"index": 0, "delta": {"content": " tok"}} if chat else {"index": 0, "text": " tok"}
            yield f"data: {json.dumps({'choices': [choice]})}\n\n"
        usage = {"prompt_tokens": len(words), "completion_tokens": n_out, "total_tokens": len(words) + n_out,
                 "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
        yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream")


app = Starlette(
    routes=[
        Route("/v1/models", models),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/metrics", metrics),
        Route("/v1/completions", generate, methods=["POST"]),
        Route("/v1/chat/completions", generate, methods=["POST"]),
    ]
)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
