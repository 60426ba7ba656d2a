"""A small HTTP/1.1 client for the router's upstream requests: pooled keep-alive connections per replica,
TCP_NODELAY, responses parsed by httptools, bodies handed over chunk by chunk as they arrive.

Why not aiohttp or httpx: on the router's hot path their per-request bookkeeping cost about 150-200 us of CPU
(bench/router/README.md); this client does only what the proxy needs (POST/GET with a bytes body, a status,
headers, a streamed body) in a few tens of microseconds.

    pool = UpstreamPool(connect_timeout_s=3)
    resp = await pool.request("POST", "http://10.0.0.5:8000/v1/completions", body, {"content-type": ...})
    resp.status, resp.headers["content-type"]
    while chunk := await resp.readany(): ...      # b"" at the end of the body
    resp.release()   # body fully read: the connection goes back to the pool;  resp.close() drops it

A connection taken from the pool that turns out to be closed by the replica (idle keep-alive expiry) before any
response byte arrived is retried once on a new connection; any other failure raises `UpstreamError` (an
OSError, like a refused connection) so the router can retry on another replica.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from urllib.parse import urlsplit

import httptools

_MAX_BUFFER = 1 << 20  # pause reading from a replica while this much body waits for a slow client


class UpstreamError(ConnectionError):
    """The connection failed or closed before the response was complete."""


class _Conn(asyncio.Protocol):
    __slots__ = ("transport", "parser", "resp", "closed", "reused", "got_bytes", "_headers", "_paused", "key")

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.resp: "UpstreamResponse | None" = None
        self.closed = False
        self.reused = False
        self.got_bytes = False
        self._headers: list[tuple[bytes, bytes]] = []
        self._paused = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.resp is None:  # bytes while idle: the replica broke the protocol; drop the connection
            self.closed = True
            self.transport.close()  # type: ignore[union-attr]
            return
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(UpstreamError(f"malformed response from upstream: {e}"))
            self.transport.close()  # type: ignore[union-attr]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.resp is not None and not self.resp._complete:
            self._fail(UpstreamError(f"upstream closed the connection{': ' + str(exc) if exc else ''}"))

    def pause_writing(self) -> None:  # the replica reads slowly; requests are small, nothing to do
        pass

    def resume_writing(self) -> None:
        pass

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        r = self.resp
        if r is None:
            return
        r.status = self.parser.get_status_code()
        r.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in self._headers}
        r.keep_alive = self.parser.should_keep_alive()
        self._headers = []
        if not r._head.done():
            r._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        r = self.resp
        if r is None:
            return
        r._chunks.append(body)
        r.arrived_at = time.monotonic()
        r._buffered += len(body)
        if r._buffered > _MAX_BUFFER and not self._paused:
            self._paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]
        r._wake()

    def on_message_complete(self) -> None:
        r = self.resp
        if r is None:
            return
        r._complete = True
        r._wake()

    def _fail(self, exc: Exception) -> None:
        r = self.resp
        if r is None:
            return
        r._error = exc
        if not r._head.done():
            r._head.set_exception(exc)
        r._wake()

    def resume(self) -> None:
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()


class UpstreamResponse:
    """Status, headers and a body read chunk by chunk."""

    __slots__ = ("status", "headers", "keep_alive", "arrived_at", "_conn", "_pool", "_head", "_chunks", "_buffered",
                 "_complete", "_error", "_waiter", "_done")

    def __init__(self, conn: _Conn, pool: "UpstreamPool") -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = False
        self.arrived_at = 0.0  # time.monotonic() when body bytes last arrived from the replica (not when read)
        self._conn, self._pool = conn, pool
        self._head: asyncio.Future = asyncio.get_running_loop().create_future()
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._complete = False
        self._error: Exception | None = None
        self._waiter: asyncio.Future | None = None
        self._done = False

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def readany(self) -> bytes:
        """The next body chunk as it arrived; b"" at the end. Raises UpstreamError if the connection broke."""
        while True:
            if self._chunks:
                c = self._chunks.popleft()
                self._buffered -= len(c)
                if self._buffered <= _MAX_BUFFER // 2:
                    self._conn.resume()
                return c
            if self._error is not None:
                raise self._error
            if self._complete:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def read(self) -> bytes:
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        """Give the connection back to the pool if the body was read to the end, else close it."""
        self._finish(reuse=self._complete and self._error is None and self.keep_alive)

    def close(self) -> None:
        """Drop the connection (the replica sees the request cancelled)."""
        self._finish(reuse=False)

    def _finish(self, reuse: bool) -> None:
        if self._done:
            return
        self._done = True
        conn = self._conn
        conn.resp = None
        if reuse and not conn.closed:
            self._pool._put(conn)
            return
        conn.closed = True
        if conn.transport is not None:
            conn.transport.close()


class UpstreamPool:
    """Idle keep-alive connections per (host, port)."""

    def __init__(self, connect_timeout_s: float = 3.0, max_idle_per_host: int = 256) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[tuple[str, int], deque[_Conn]] = {}
        self._split: dict[str, tuple[tuple[str, int], bytes, bytes]] = {}
        self._closed = False

    def _target(self, url: str) -> tuple[tuple[str, int], bytes, bytes]:
        t = self._split.get(url)
        if t is None:
            u = urlsplit(url)
            if u.scheme != "http":
                raise ValueError(f"only http:// upstreams are supported, got {url!r}")
            port = u.port or 80
            path = (u.path or "/") + (f"?{u.query}" if u.query else "")
            t = ((u.hostname or "127.0.0.1", port), path.encode(), f"{u.hostname}:{port}".encode())
            if len(self._split) < 4096:
                self._split[url] = t
        return t

    def _put(self, conn: _Conn) -> None:
        q = self._idle.setdefault(conn.key, deque())
        if self._closed or len(q) >= self.max_idle_per_host:
            conn.closed = True
            conn.transport.close()  # type: ignore[union-attr]
            return
        conn.reused = True
        q.append(conn)

    async def _get(self, key: tuple[str, int]) -> _Conn:
        q = self._idle.get(key)
        while q:
            conn = q.pop()  # most recently used: least likely to have timed out
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            _, conn = await loop.create_connection(lambda: _Conn(key), key[0], key[1])
        return conn  # type: ignore[return-value]

    async def request(self, method: str, url: str, body: bytes = b"", headers: dict[str, str] | None = None
                      ) -> UpstreamResponse:
        """Send a request; returns once the response headers arrived (the body is read with readany/read)."""
        key, path, host = self._target(url)
        head = [method.encode(), b" ", path, b" HTTP/1.1\r\nhost: ", host, b"\r\ncontent-length: ",
                str(len(body)).encode(), b"\r\n"]
        for k, v in (headers or {}).items():
            head += [k.encode("latin-1"), b": ", v.encode("latin-1"), b"\r\n"]
        head.append(b"\r\n")
        data = b"".join(head) + body
        for _ in range(2):
            conn = await self._get(key)
            resp = UpstreamResponse(conn, self)
            conn.resp, conn.got_bytes = resp, False
            conn.transport.write(data)  # type: ignore[union-attr]
            try:
                await resp._head
                return resp
            except UpstreamError:
                stale = conn.reused and not conn.got_bytes
                resp.close()
                if not stale:
                    raise
            except BaseException:
                resp.close()
                raise
        raise UpstreamError(f"{url}: connection closed before a response, twice")

    async def close(self) -> None:
        self._closed = True
        for q in self._idle.values():
            while q:
                c = q.pop()
                if c.transport is not None:
                    c.transport.close()
        self._idle.clear()
