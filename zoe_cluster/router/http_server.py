"""The HTTP/1.1 server side of the router and the simulated engine: uvicorn's httptools protocol with

- a header read timeout: a request's whole header must arrive within `header_timeout_s` of its first byte (or of
  the connection being made), else the client gets 408 and the connection is closed;
- a body read timeout: the whole body must arrive within `body_timeout_s` of the header, else 408 (when no
  response started) and the connection is closed; the application sees a disconnect;
- close-delimited responses to HTTP/1.0 clients: a response without content-length is sent with
  `connection: close` and no `transfer-encoding: chunked`, which HTTP/1.0 does not have (uvicorn's httptools
  protocol chunks every such response).

Without the timeouts a client sending its header or body one byte per second holds a connection, and the
request's task, without limit.

    serve(app, host, port, header_timeout_s=10, body_timeout_s=60)            # blocking, as uvicorn.run
    uvicorn.Config(app, http=hardened_http(10, 60), ...)                        # for a uvicorn.Server of your own

The HTTP/1.0 framing sets three attributes of uvicorn's `RequestResponseCycle` (`keep_alive`, `chunked_encoding`,
`expected_content_length`) before handing each message to its own `send`; tests/router/test_edges.py checks it
against the uvicorn that constraints.txt pins.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_408 = json.dumps({"error": {"message": "request not received in time", "type": "invalid_request_error",
                             "param": None, "code": 408}}).encode()
_408_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: "
                 + str(len(_408)).encode() + b"\r\nconnection: close\r\n\r\n" + _408)


class HardenedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header and body read timeouts and HTTP/1.0 framing (module docstring).
    Subclass it with the timeouts set, as `hardened_http` does."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._read_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm(self.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(seconds, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete or not cycle.response_started:
            self.transport.write(_408_RESPONSE)
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the application's receive() answers http.disconnect, its send() is dropped
            cycle.message_event.set()
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._read_timer is None:
            self._arm(self.header_timeout_s)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.body_timeout_s)
        cycle = self.cycle
        if cycle is not None and self.scope.get("http_version") == "1.0":
            cycle.send = _close_delimited(cycle)  # type: ignore[method-assign]

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()


def _close_delimited(cycle: Any) -> Any:
    """`cycle.send` for an HTTP/1.0 client: a response without content-length ends when the connection closes."""
    send = cycle.send
    framing = {"close": False}

    async def send_http10(message: dict) -> None:
        if message["type"] == "http.response.start" and not cycle.response_started:
            names = {k.lower() for k, _ in message.get("headers", [])}
            if b"content-length" not in names:
                framing["close"] = True
                cycle.keep_alive = False  # uvicorn adds connection: close and closes after the last body message
                cycle.chunked_encoding = False  # uvicorn chunks only when this is still None
                message = {**message, "headers": [(k, v) for k, v in message.get("headers", [])
                                                  if k.lower() != b"transfer-encoding"]}
        elif framing["close"] and message["type"] == "http.response.body" and not cycle.response_complete:
            cycle.expected_content_length = len(message.get("body", b""))  # uvicorn's length check passes
        await send(message)

    return send_http10


def hardened_http(header_timeout_s: float, body_timeout_s: float) -> type[HardenedHttpToolsProtocol]:
    """The protocol class to give uvicorn (`http=`), with these timeouts (seconds)."""
    return type("HardenedHttp", (HardenedHttpToolsProtocol,),
                {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s})


def serve(app: Any, host: str, port: int, *, header_timeout_s: float, body_timeout_s: float, **uvicorn_kw: Any
          ) -> None:
    """uvicorn.run(app, ...) with the hardened protocol (blocking)."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, http=hardened_http(header_timeout_s, body_timeout_s), **uvicorn_kw)
