"""Mid-stream migration: a stream whose replica died, reset or went silent continues on another replica from
what the client already received, and the client sees one stream.

What the client received is recorded by a `StreamLedger`: the proxy hands it every upstream chunk and forwards
only whole SSE events (`take`), so a break never leaves half an event at the client. The events are parsed only
when a migration needs them (`settle`), so a stream that never breaks pays for a `rfind` and a list append per
chunk.

The continuation (`continuation_body`) is the original request with:
- completions: the prompt plus what was generated, as token ids when the engine returned them (the router asks
  for them with vLLM's and SGLang's `return_token_ids` when the prompt is short enough,
  `RouterConfig.migration_token_ids_max_prompt`; a token-id prompt then continues exactly where the first engine
  stopped), else as text (the prompt text plus the generated text, tokenized again by the new engine);
- chat: the partial assistant message appended to `messages` with `continue_final_message: true` and
  `add_generation_prompt: false` (vLLM's fields; SGLang reads `continue_final_message` and ignores the other);
- `max_tokens` / `max_completion_tokens` (and `min_tokens`) reduced by the tokens already generated; every
  other field (sampling parameters, stop, stream_options) unchanged.

Its events are rewritten (`SpliceRewriter`) to look like the first stream's: the first stream's id, created
and model; chat role-only deltas dropped; the token-id fields removed unless the client asked for them; usage
counted for the whole request (prompt_tokens of the original prompt, completion_tokens of every stream).

Not continued (the stream ends with an error event, as before): several choices (`n` > 1, `best_of`, beam
search), `echo`, `prompt_logprobs`, structured output (a grammar would restart from its beginning), and chat
output with tool calls or reasoning text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# A JSON string cannot hold these members' bytes (its quotes are \"), so they are cut from the bytes as they are.
_TOKEN_FIELDS = (b',"prompt_token_ids":', b',"token_ids":')
_TOKEN_FIELDS_RE = re.compile(rb',"(?:prompt_)?token_ids":(?:\[[0-9,\s]*\]|null)')
_RE_MAX_BYTES = 4096  # the regex is faster on token events; find() on a first event with a long prompt's ids
_STRUCTURED = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
               "guided_grammar", "regex", "json_schema", "ebnf")
OUTCOMES = ("continued", "failed", "completed", "exhausted", "not_continuable", "no_replica")
"""Outcomes counted by `zoe_router_migrations`: continued (a continuation stream finished the request), failed (a
continuation failed too; another may follow), completed (the output had already ended; only the end of the stream
was missing), exhausted (`migration_limit` continuations failed), not_continuable (a request or output this module
does not continue), no_replica (no other replica could take the continuation)."""


class EngineErrorEvent(Exception):
    """A stream carried an error event of the engine's own with a 5xx code (vLLM's EngineDeadError, a retryable
    request error): the replica failed mid-stream. `before` holds the client's bytes of the whole events that
    preceded it. An error event with a 4xx code is the request's problem and reaches the client as it is."""

    def __init__(self, message: str, before: bytes) -> None:
        super().__init__(message)
        self.message, self.before = message, before


def _server_error(event: dict[str, Any]) -> str | None:
    """The message of an engine error event with a 5xx code, else None."""
    err = event.get("error")
    if not isinstance(err, dict):
        return None
    code = err.get("code")
    if isinstance(code, int) and code >= 500:
        return f"error event from the engine: {str(err.get('message'))[:200]}"
    return None


class NotContinuable(Exception):
    """The request or what it produced cannot be continued on another replica (the message says why)."""


def continuable(body: dict[str, Any], endpoint: str) -> str | None:
    """Why a streamed request cannot migrate, or None if it can (decided from the request alone)."""
    if (body.get("n") or 1) != 1 or (body.get("best_of") or 1) != 1 or body.get("use_beam_search"):
        return "several choices per request"
    if endpoint == "completions" and body.get("echo"):
        return "echo"
    if body.get("prompt_logprobs"):
        return "prompt_logprobs"
    fmt = body.get("response_format")
    if any(body.get(k) for k in _STRUCTURED if k != "response_format") or (
            isinstance(fmt, dict) and fmt.get("type") not in (None, "text")):
        return "structured output"
    return None


def ask_token_ids(raw: bytes) -> bytes:
    """The request body with `"return_token_ids": true` added (a byte splice after the opening brace, so a long
    prompt is not serialised again). The body is a JSON object that has a prompt, so it has a first member."""
    i = raw.index(b"{")
    return raw[:i + 1] + b'"return_token_ids":true,' + raw[i + 1:]


@dataclass
class StreamLedger:
    """What the client of one streamed request has received (whole SSE events) and what that means for a
    continuation. One choice (index 0): several choices are not continued."""

    endpoint: str
    """"completions" or "chat"."""
    strip_token_ids: bool
    """The router asked for token ids the client did not: remove them from the events forwarded."""
    text: list[str] = field(default_factory=list)
    gen_ids: list[int] = field(default_factory=list)
    """Token ids of `text`: those of events whose text reached the client (an engine holds back the text of a
    token that ends inside a UTF-8 character or may start a stop string; such ids wait in `_held`)."""
    prompt_ids: list[int] | None = None
    token_events: int = 0
    """Events that carried generated text (about one token each on vLLM and SGLang)."""
    ids_complete: bool = True
    """Every event with generated text also carried its token ids."""
    finish_reason: str | None = None
    usage_seen: bool = False
    done: bool = False
    """`data: [DONE]` reached the client."""
    blocked: str | None = None
    """Output this module cannot continue (tool calls, reasoning), or None."""
    first: dict[str, Any] = field(default_factory=dict)
    """id, created and model of the first event."""
    _raw: list[bytes] = field(default_factory=list)
    _tail: bytes = b""
    _held: list[int] = field(default_factory=list)

    # --- the hot path: whole events only, parsed later
    def take(self, chunk: bytes) -> bytes:
        """The whole SSE events of `chunk` (with what an earlier chunk left unfinished), for the client; an
        unfinished event waits for the next chunk."""
        if self._tail:
            chunk, self._tail = self._tail + chunk, b""
        cut = chunk.rfind(b"\n\n") + 2
        if cut == 1:  # no whole event yet
            self._tail = chunk
            return b""
        if cut < len(chunk):
            chunk, self._tail = chunk[:cut], chunk[cut:]
        if b'{"error"' in chunk:  # cannot occur inside a JSON string (its quotes would be escaped)
            chunk = self._until_server_error(chunk)
        self._raw.append(chunk)
        return strip_token_ids(chunk) if self.strip_token_ids else chunk

    def _until_server_error(self, block: bytes) -> bytes:
        """`block` as it is, or, when it holds an engine error event with a 5xx code, raise EngineErrorEvent with
        the events before it (recorded here)."""
        at = 0
        for part in block.split(b"\n\n"):
            end = at + len(part) + 2
            for event in _events(part + b"\n\n"):
                if event is not None and (msg := _server_error(event)) is not None:
                    before = block[:at]
                    if before:
                        self._raw.append(before)
                    raise EngineErrorEvent(msg, strip_token_ids(before) if self.strip_token_ids else before)
            at = end
        return block

    def rest(self) -> bytes:
        """What is left unfinished after the upstream ended cleanly (sent as it is)."""
        tail, self._tail = self._tail, b""
        return tail

    def settle(self) -> None:
        """Parse the events taken since the last call."""
        raw, self._raw = self._raw, []
        for block in raw:
            for event in _events(block):
                self.absorb(event)

    # --- parsed events
    def absorb(self, event: dict[str, Any] | None) -> None:
        """Record one event (None: `[DONE]`)."""
        if event is None:
            self.done = True
            return
        if not self.first and "id" in event:
            self.first = {k: event[k] for k in ("id", "created", "model") if k in event}
        if event.get("usage") and not event.get("choices"):
            self.usage_seen = True
        if self.prompt_ids is None and isinstance(event.get("prompt_token_ids"), list):  # vLLM chat: on the event
            self.prompt_ids = event["prompt_token_ids"]
        for choice in event.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            if self.prompt_ids is None and isinstance(choice.get("prompt_token_ids"), list):
                self.prompt_ids = choice["prompt_token_ids"]
            if self.endpoint == "chat":
                delta = choice.get("delta") or {}
                piece = delta.get("content") or ""
                if delta.get("tool_calls") or delta.get("reasoning_content") or delta.get("reasoning"):
                    self.blocked = "tool calls or reasoning in the output"
            else:
                piece = choice.get("text") or ""
            ids = choice.get("token_ids")
            if isinstance(ids, list):
                self._held.extend(ids)
            elif piece:
                self.ids_complete = False
            if piece:
                self.token_events += 1
                self.text.append(piece)
                self.gen_ids.extend(self._held)
                self._held.clear()
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    @property
    def generated_tokens(self) -> int:
        """Tokens the client received: the token ids counted when every event had them, else the events."""
        return len(self.gen_ids) if self.ids_complete and self.gen_ids else self.token_events

    @property
    def output_ended(self) -> bool:
        """The output is complete (a finish reason, or [DONE]): nothing is left to generate."""
        return self.done or self.finish_reason is not None


def strip_token_ids(data: bytes) -> bytes:
    """SSE event bytes without their `prompt_token_ids` and `token_ids` members (a list of ints or null)."""
    if len(data) <= _RE_MAX_BYTES:
        return _TOKEN_FIELDS_RE.sub(b"", data)
    for key in _TOKEN_FIELDS:
        j = data.find(key)
        if j < 0:
            continue
        parts, i = [], 0
        while j >= 0:
            parts.append(data[i:j])
            k = j + len(key)
            i = k + 4 if data.startswith(b"null", k) else data.index(b"]", k) + 1
            j = data.find(key, i)
        parts.append(data[i:])
        data = b"".join(parts)
    return data


def _events(block: bytes) -> list[dict[str, Any] | None]:
    out: list[dict[str, Any] | None] = []
    for part in block.split(b"\n\n"):
        for line in part.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                out.append(None)
            elif data:
                try:
                    obj = json.loads(data)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    out.append(obj)
    return out


def chat_by_token_ids(body: dict[str, Any]) -> bool:
    """Whether a streamed chat request continues, if it must, as a completion of token ids (exact: the rendered
    prompt and the generated ids, which the router then asks for). Not with tools or logprobs: the chat server's
    tool parser and its logprobs format would be missing from a completion's stream."""
    return not body.get("tools") and not body.get("logprobs") and not body.get("functions")


_CHAT_ONLY = ("messages", "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
              "chat_template", "chat_template_kwargs", "add_generation_prompt", "continue_final_message",
              "documents", "max_completion_tokens", "reasoning_effort", "include_reasoning", "top_logprobs",
              "mm_processor_kwargs", "media_io_kwargs", "return_token_ids")


def final_usage_event(body: dict[str, Any], ledger: StreamLedger) -> bytes:
    """The usage event a stream whose output ended, but whose replica failed before its usage event, still owes
    the client (`stream_options.include_usage`); b"" when none is owed or the prompt's token count is unknown."""
    opts = body.get("stream_options")
    if not isinstance(opts, dict) or not opts.get("include_usage") or ledger.usage_seen or ledger.prompt_ids is None:
        return b""
    prompt, done = len(ledger.prompt_ids), ledger.generated_tokens
    event = {**ledger.first, "object": "chat.completion.chunk" if ledger.endpoint == "chat" else "text_completion",
             "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}}
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def continuation_body(body: dict[str, Any], endpoint: str, ledger: StreamLedger,
                      want_ids: bool) -> tuple[str, bytes]:
    """The request that continues `ledger`'s stream on another replica, and its endpoint ("completions" or
    "chat"; a chat whose token ids are known continues as a completion). Raises NotContinuable."""
    if ledger.blocked:
        raise NotContinuable(ledger.blocked)
    out = dict(body)
    done = ledger.generated_tokens
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(out.get(key), int):
            out[key] -= done
            if out[key] < 1:
                raise NotContinuable(f"{key} already reached")
    if isinstance(out.get("min_tokens"), int):
        out["min_tokens"] = max(0, out["min_tokens"] - done)
    generated = "".join(ledger.text)
    by_ids = ledger.prompt_ids is not None and ledger.ids_complete
    if endpoint == "chat" and by_ids and chat_by_token_ids(body):
        if "max_completion_tokens" in out:
            out["max_tokens"] = out["max_completion_tokens"]
        out = {k: v for k, v in out.items() if k not in _CHAT_ONLY}
        out["prompt"] = ledger.prompt_ids + ledger.gen_ids  # type: ignore[operator]
        out["return_token_ids"] = True
        return "completions", json.dumps(out, separators=(",", ":")).encode()
    if endpoint == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if ledger.prompt_ids is not None and ledger.ids_complete:
            out["prompt"] = ledger.prompt_ids + ledger.gen_ids
        elif isinstance(prompt, str):
            out["prompt"] = prompt + generated
        else:
            raise NotContinuable("a token-id prompt, and the engine did not return the generated token ids")
        if want_ids:
            out["return_token_ids"] = True
    else:
        messages = list(body.get("messages") or ())
        last = messages[-1] if messages else None
        if body.get("continue_final_message") and isinstance(last, dict) and last.get("role") == "assistant":
            if not isinstance(last.get("content"), str):
                raise NotContinuable("a final assistant message whose content is not text")
            messages[-1] = {**last, "content": last["content"] + generated}
        else:
            messages.append({"role": "assistant", "content": generated})
        out["messages"] = messages
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    return endpoint, json.dumps(out, separators=(",", ":")).encode()


class SpliceRewriter:
    """Rewrites a continuation's SSE events into the client's stream (and records them in the ledger)."""

    def __init__(self, ledger: StreamLedger, client_wants_ids: bool, as_chat: bool = False) -> None:
        self.ledger = ledger
        self.client_wants_ids = client_wants_ids
        self.as_chat = as_chat
        """The continuation is a completion standing in for a chat: its events become chat chunks."""
        self.before = ledger.generated_tokens
        """Tokens generated before this continuation (its usage counts only its own)."""
        self.prompt_tokens = len(ledger.prompt_ids) if ledger.prompt_ids is not None else None
        self._started = False
        self._tail = b""

    def take(self, chunk: bytes) -> bytes:
        """The client's bytes for a chunk of the continuation (whole events only)."""
        data = self._tail + chunk
        cut = data.rfind(b"\n\n") + 2
        if cut == 1:
            self._tail = data
            return b""
        data, self._tail = data[:cut], data[cut:]
        out: list[bytes] = []
        for event in _events(data):
            if event is None:
                self.ledger.absorb(None)
                out.append(b"data: [DONE]\n\n")
                continue
            if (msg := _server_error(event)) is not None:
                raise EngineErrorEvent(msg, b"".join(out))
            event = self._rewrite(event)
            if event is not None:
                out.append(b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")
        return b"".join(out)

    def rest(self) -> bytes:
        """What is left unfinished after the continuation ended cleanly (sent as it is)."""
        tail, self._tail = self._tail, b""
        return tail

    def _rewrite(self, event: dict[str, Any]) -> dict[str, Any] | None:
        ledger = self.ledger
        if "error" in event:
            return event
        event.pop("prompt_token_ids", None)  # the continuation's prompt is not the client's
        for choice in event.get("choices") or ():
            choice.pop("prompt_token_ids", None)
        if self.as_chat:
            event["object"] = "chat.completion.chunk"
            for choice in event.get("choices") or ():
                choice["delta"] = {"content": choice.pop("text", "")}
        ledger.absorb(event)
        event.update(ledger.first)
        choices = []
        for choice in event.get("choices") or ():
            if not self.client_wants_ids:
                choice.pop("token_ids", None)
            delta = choice.get("delta")
            if isinstance(delta, dict):
                delta.pop("role", None)
                if not delta.get("content") and len(delta) <= 1 and not choice.get("finish_reason") \
                        and not choice.get("logprobs"):
                    continue  # the continuation's opening role delta: the client had it already
            choices.append(choice)
        usage = event.get("usage")
        if isinstance(usage, dict):
            self._fix_usage(usage)
        if not choices and not usage:
            return None
        event["choices"] = choices
        return event

    def _fix_usage(self, usage: dict[str, Any]) -> None:
        prompt = usage.get("prompt_tokens")
        completion = usage.get("completion_tokens")
        if not isinstance(prompt, int) or not isinstance(completion, int):
            return
        original = self.prompt_tokens if self.prompt_tokens is not None else max(0, prompt - self.before)
        usage["prompt_tokens"] = original
        usage["completion_tokens"] = completion + self.before
        usage["total_tokens"] = original + completion + self.before
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            details["cached_tokens"] = min(details["cached_tokens"], original)
