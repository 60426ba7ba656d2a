"""A FAKE, fast OpenAI-ish backend for router-overhead benchmarks: raw asyncio protocol, no HTTP framework, no
sleeps, keep-alive. It is not an engine; it only lets a router's own cost be measured.

  POST /v1/completions, /v1/chat/completions   non-stream: a fixed JSON completion
                                               "stream": true -> SSE of EVENTS events GAP_MS apart, chunked; each
                                               event carries "t", the backend's time.time() when it wrote it
  GET anything                                 200 {} (so /health, /v1/models, /get_model_info all answer)

    python bench/router/fast_backend.py --port 9001 [--events 5 --gap-ms 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

COMPLETION = json.dumps(
    {"id": "cmpl-bench", "object": "text_completion", "created": 0, "model": "m",
     "choices": [{"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}],
     "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9}}
).encode()
MODELS = json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "bench"}]}).encode()


def _response(status: bytes, body: bytes, ctype: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: " + ctype + b"\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


class Backend(asyncio.Protocol):
    events = 5
    gap_s = 0.01

    def connection_made(self, transport):
        self.t = transport
        self.buf = b""
        self.busy = False

    def data_received(self, data):
        self.buf += data
        self._drain()

    def _drain(self):
        while not self.busy:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            lines = head.split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            clen = 0
            for line in lines[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    clen = int(v.strip())
            if len(self.buf) < end + 4 + clen:
                return
            body = self.buf[end + 4 : end + 4 + clen]
            self.buf = self.buf[end + 4 + clen :]
            self._handle(method, path, body)

    def _handle(self, method, path, body):
        if method == "GET":
            self.t.write(_response(b"200 OK", MODELS if path.startswith("/v1/models") else b"{}"))
            return
        if b'"stream": true' in body or b'"stream":true' in body:
            self.busy = True
            self.t.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            asyncio.get_running_loop().create_task(self._stream())
            return
        self.t.write(_response(b"200 OK", COMPLETION))

    async def _stream(self):
        for i in range(self.events):
            if i:
                await asyncio.sleep(self.gap_s)
            ev = f'data: {{"i": {i}, "t": {time.time():.6f}, "choices": [{{"text": "x"}}]}}\n\n'.encode()
            self.t.write(b"%x\r\n%s\r\n" % (len(ev), ev))
        done = b"data: [DONE]\n\n"
        self.t.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        self.busy = False
        self._drain()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--events", type=int, default=5)
    ap.add_argument("--gap-ms", type=float, default=10.0)
    a = ap.parse_args()
    Backend.events, Backend.gap_s = a.events, a.gap_ms / 1000
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    async def serve():
        server = await asyncio.get_running_loop().create_server(Backend, a.host, a.port, backlog=1024)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
