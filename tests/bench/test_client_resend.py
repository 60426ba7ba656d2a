"""zoe's bench client sends a request again when its connection is refused or its stream is cut before `[DONE]`
(a router process killed mid-stream), and reports what it sent again; answers (HTTP errors, SSE error events)
are not re-sent."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from tests.conftest import free_port
from zoe_cluster.bench.client import RequestSpec, StreamingClient


def _event(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _serve(cuts: list[str], calls: list[int]):
    """A server whose i-th request is answered as cuts[i] says: 'reset' (2 chunks, then the connection is
    aborted), 'close' (2 chunks, then a clean end without [DONE]), '500', 'error' (an SSE error event), else a
    whole stream of 4 chunks with usage and [DONE]."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        how = cuts[len(calls)] if len(calls) < len(cuts) else "ok"
        calls.append(1)
        if how == "500":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if how == "error":
            await resp.write(_event({"error": {"message": "no replica"}}) + b"data: [DONE]\n\n")
            return resp
        for k in range(2 if how in ("reset", "close") else 4):
            await resp.write(_event({"choices": [{"index": 0, "text": f"t{k} "}]}))
        if how == "reset":
            request.transport.abort()
            return resp
        if how == "ok":
            await resp.write(_event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}))
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def _run(cuts: list[str], resend_limit: int = 2):
    async def main():
        calls: list[int] = []
        runner, url = await _serve(cuts, calls)
        try:
            async with StreamingClient(url, "m", timeout_s=10, resend_limit=resend_limit) as c:
                return await c.send(RequestSpec("hello", 4)), len(calls)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


@pytest.mark.parametrize("cut", ["reset", "close"])
def test_a_cut_stream_is_sent_again_and_counted_once(cut):
    res, calls = _run([cut, cut])
    assert res.ok and res.error is None and calls == 3 and res.resent == 2
    assert res.output_tokens == 4 and res.output_chunks == 4  # the whole new stream, nothing of the cut ones
    assert res.to_json()["resent"] == 2


def test_past_the_limit_the_cut_is_the_error():
    res, calls = _run(["reset", "close"], resend_limit=1)
    assert not res.ok and calls == 2 and res.resent == 1 and "[DONE]" in res.error
    res, calls = _run(["reset"], resend_limit=0)
    assert not res.ok and calls == 1 and res.resent == 0


@pytest.mark.parametrize("answer, message", [("500", "HTTP 500"), ("error", "stream error: no replica")])
def test_answers_are_not_sent_again(answer, message):
    res, calls = _run([answer])
    assert not res.ok and calls == 1 and res.resent == 0 and message in res.error


def test_a_refused_connection_is_tried_again_then_reported():
    async def main():
        async with StreamingClient(f"http://127.0.0.1:{free_port()}", "m", timeout_s=5, resend_limit=2) as c:
            return await c.send(RequestSpec("hello", 4))

    res = asyncio.run(main())
    assert not res.ok and res.resent == 2 and "Connect" in res.error
