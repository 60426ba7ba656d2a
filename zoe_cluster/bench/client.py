"""An async streaming client that times requests from the client side.

Every request is sent with `stream: true` and `stream_options.include_usage`, so the client sees when each
chunk arrives: TTFT is the time to the first chunk that carries output text, inter-token latencies are the
gaps between later chunks with output, end-to-end is the time to the end of the stream. Token counts come
from the final usage chunk when the server sends one (vLLM, SGLang and zoe's simulated engine do), else from
the number of output chunks.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

Api = Literal["completions", "chat"]


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload: the prompt, how many tokens to generate, and sampling."""

    prompt: str
    max_tokens: int
    api: Api = "completions"
    ignore_eos: bool = True
    temperature: float = 0.0
    top_p: float = 1.0
    tag: str = ""
    """A label the workload uses to group results (e.g. the length x hit-rate cell)."""
    session: str | None = None
    """Session key, sent as the `x-session-id` header and the OpenAI `user` field (routers' affinity hint)."""


@dataclass
class RequestResult:
    """What the client saw of one request; times are seconds of `StreamingClient.now()`."""

    tag: str
    ok: bool
    start_s: float
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_chunks: int = 0
    resent: int = 0
    """Times the request was sent again after its connection was refused or its stream cut."""

    @property
    def decode_s(self) -> float | None:
        """Time from the first output chunk to the end of the stream (the decode phase)."""
        if self.ttft_s is None or self.e2e_s is None:
            return None
        return self.e2e_s - self.ttft_s

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens per second after the first one (TTFT excluded, as the seed reports decode)."""
        d = self.decode_s
        if d is None or d <= 0 or self.output_tokens < 2:
            return None
        return (self.output_tokens - 1) / d

    def to_json(self) -> dict[str, Any]:
        return {
            "tag": self.tag,
            "ok": self.ok,
            "error": self.error,
            "start_s": self.start_s,
            "ttft_s": self.ttft_s,
            "e2e_s": self.e2e_s,
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "decode_tok_s": self.decode_tok_s,
            "mean_itl_s": (sum(self.itl_s) / len(self.itl_s)) if self.itl_s else None,
            "resent": self.resent,
        }


def request_body(spec: RequestSpec, model: str) -> dict[str, Any]:
    """The JSON body sent for `spec` (OpenAI completions or chat, streaming with usage)."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": spec.max_tokens,
        "temperature": spec.temperature,
        "top_p": spec.top_p,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if spec.ignore_eos:
        # vLLM, SGLang and the simulated engine accept these extensions; they make the output length exact.
        body["ignore_eos"] = True
        body["min_tokens"] = spec.max_tokens
    if spec.session is not None:
        body["user"] = spec.session
    if spec.api == "chat":
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    return body


def _chunk_text(chunk: dict[str, Any]) -> str:
    parts = []
    for choice in chunk.get("choices") or []:
        if "text" in choice and choice["text"]:
            parts.append(choice["text"])
        delta = choice.get("delta") or {}
        for key in ("content", "reasoning_content", "reasoning"):
            if delta.get(key):
                parts.append(delta[key])
    return "".join(parts)


class StreamingClient:
    """Sends `RequestSpec`s to one OpenAI-compatible base URL over one pooled aiohttp session.

    Use as `async with StreamingClient(url, model) as client: await client.send(spec)`."""

    def __init__(
        self, base_url: str, model: str, timeout_s: float = 3600.0, api_key: str | None = None,
        server_time_scale: float = 1.0, resend_limit: int = 2,
    ):  # fmt: skip
        if server_time_scale <= 0:
            raise ValueError("server_time_scale must be positive")
        if resend_limit < 0:
            raise ValueError("resend_limit must be >= 0")
        self.resend_limit = resend_limit
        self.base_url = base_url.rstrip("/")
        self.server_time_scale = server_time_scale
        self.model = model
        self.timeout_s = timeout_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> StreamingClient:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            headers=self.headers,
            read_bufsize=1 << 20,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def now(self) -> float:
        """Seconds on the server's clock: wall seconds / `server_time_scale` (a simulated engine run with
        `--time-scale X` lives X times faster than its model seconds; 1 for a real engine)."""
        return time.perf_counter() / self.server_time_scale

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("StreamingClient used outside `async with`")
        return self._session

    async def send(self, spec: RequestSpec) -> RequestResult:
        """Send one streaming request and time it, sending it again from the start when its connection is refused
        or its stream cut (up to `resend_limit` times); failures come back as `ok=False` with the reason."""
        start = self.now()
        for attempt in range(self.resend_limit + 1):
            result = RequestResult(tag=spec.tag, ok=False, start_s=start, resent=attempt)
            try:
                await self._stream(spec, result, start)
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, _StreamCut) as exc:  # refused, cut
                result.error = f"{type(exc).__name__}: {exc}"
                if attempt < self.resend_limit:
                    await asyncio.sleep(0.05 * (attempt + 1))
                    continue
            except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, ValueError) as exc:
                result.error = f"{type(exc).__name__}: {exc}"
            return result
        return result  # pragma: no cover (the loop returns)

    async def _stream(self, spec: RequestSpec, result: RequestResult, start: float) -> None:
        path = "/v1/chat/completions" if spec.api == "chat" else "/v1/completions"
        last: float | None = None
        headers = {"x-session-id": spec.session} if spec.session is not None else None
        async with self.session.post(self.base_url + path, json=request_body(spec, self.model),
                                     headers=headers) as resp:
            if resp.status != 200:
                text = (await resp.text())[:500]
                result.error = f"HTTP {resp.status}: {text}"
                return
            buffer = b""
            done = False
            async for raw in resp.content:
                buffer += raw
                if not buffer.endswith(b"\n"):
                    continue
                line, buffer = buffer.strip(), b""
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                now = self.now()
                chunk = json.loads(data)
                if "error" in chunk and not chunk.get("choices"):
                    err = chunk["error"]
                    result.error = f"stream error: {err.get('message', err) if isinstance(err, dict) else err}"
                    return
                if _chunk_text(chunk):
                    result.output_chunks += 1
                    if result.ttft_s is None:
                        result.ttft_s = now - start
                    elif last is not None:
                        result.itl_s.append(now - last)
                    last = now
                usage = chunk.get("usage")
                if usage:
                    result.prompt_tokens = usage.get("prompt_tokens")
                    result.output_tokens = int(usage.get("completion_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    if details.get("cached_tokens") is not None:
                        result.cached_tokens = int(details["cached_tokens"])
            if not done:
                raise _StreamCut("the stream ended before [DONE]")
        result.e2e_s = self.now() - start
        if not result.output_tokens:
            result.output_tokens = result.output_chunks
        if result.ttft_s is None:
            # A stream without output text (e.g. only EOS): count the end as the first token.
            result.ttft_s = result.e2e_s
        result.ok = True


class _StreamCut(Exception):
    """A stream that ended without `[DONE]`: its connection was closed mid-stream."""
