"""Chat bodies parsed and hashed once: a request that extends a body the router has seen pays only for its new part.

An agentic client resends the whole conversation with every turn, so turn n+1's body is turn n's body with
messages appended: at 1M tokens that is 4 MB of JSON to parse, render and hash per request, almost all of it
known. `ChatPrefixCache.parse(raw, session)` returns the body's top-level fields and the prompt's
`hashing.TextChain` (the chain hashes and the token estimate of `render_chat(messages, tools)`), and remembers,
per session key, the body's bytes (the same object, not a copy), where its last message ends, and the chain after
that message. A later body of the same session that starts with exactly those bytes (one memcmp) holds the same
messages up to there, and the same fields before them; only the bytes after are decoded and parsed, and only the
new messages are rendered and hashed. `tools` render before the messages: when the field comes after the messages
its JSON text must equal the remembered one, else the body is parsed whole. The result always equals parsing and
hashing the body from scratch (tests/routing/test_chat_prefix.py checks it on random edits).

The parse is Python's JSON scanner (`json.JSONDecoder.scan_once`, what `json.loads` runs) driven member by
member: a whole body's messages array is one scanner call (its last message ends at the last `}` before the
`]`), a follow-up's new messages are scanned one by one from the remembered end. The bytes it parses are held
to the router's bounds first (`routing.json_limits`: nesting deeper than `max_depth`, a number literal longer
than `max_number_chars` characters; the whole body, or a follow-up's new bytes), and the scanner refuses NaN and
Infinity; on any of those, on malformed JSON, on a body that is not an
object with a `messages` member, on a duplicated `messages` key or a body not in UTF-8, `parse` returns None and
the caller parses the body its usual way (which also words the error).

Bodies are remembered by the session key the caller passes (the router passes the `x-session-id` header), one
body per session. A body without a key is remembered by its first `PROBE_BYTES` bytes instead, up to
`BODIES_PER_PROBE` bodies per such key (sessions of one agent share their system prompt, so they share the key);
a new body is compared with each of them (a memcmp stops at the first differing byte). The cache holds at most
`max_sessions` keys and `max_bytes` bytes of bodies, least recently used out first; bodies shorter than
`min_bytes` are not remembered (they are cheap to parse, and would crowd out the long ones).
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from zoe_cluster.routing.hashing import DEFAULT_BLOCK_TOKENS, TextChain, render_message, render_tools
from zoe_cluster.routing.json_limits import limit_violation

DEFAULT_MAX_SESSIONS = 4096
DEFAULT_MAX_BYTES = 512 * 1024 * 1024
"""Bytes of remembered bodies (the bodies themselves; their hash chains, as Python ints, add about 1/7)."""
DEFAULT_MIN_BYTES = 32 * 1024
"""Bodies shorter than this (about 8K tokens) are parsed whole every time (under 0.5 ms) and not remembered."""

PROBE_BYTES = 1024
"""Leading bytes that key a body sent without a session key."""
BODIES_PER_PROBE = 16
"""Bodies remembered per key of leading bytes (concurrent sessions of one agent)."""

_WS = re.compile(r"[ \t\n\r]*")
_MESSAGES_KEY = b'"messages"'


class _NotHandled(Exception):
    """The body is not one this parser handles; the caller parses it its usual way."""


@dataclass(frozen=True, slots=True)
class ParsedChat:
    """A chat body as the router needs it."""

    fields: dict[str, Any]
    """The body's top-level members; `messages` is left out (the prompt is in `prompt`)."""
    prompt: TextChain
    """Chain hashes and token estimate of the rendered tools and messages."""
    reused_chars: int = 0
    """Characters of the rendered prompt taken from a remembered body instead of being rendered again."""


@dataclass(frozen=True, slots=True)
class _Known:
    """What is remembered of a session's last chat body."""

    raw: bytes
    end: int
    """Byte offset just after the last message (the messages array's `]` and the rest follow)."""
    head: dict[str, Any]
    """Members before `messages` (covered by the byte comparison)."""
    tools_json: str | None
    """The JSON text of a `tools` member that comes after the messages (None: tools come before, or none)."""
    prompt: TextChain
    messages: int


class ChatPrefixCache:
    """Parses chat bodies and remembers each session's last one (see the module docstring)."""

    def __init__(
        self,
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
        *,
        max_depth: int = 128,
        max_number_chars: int = 100,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        min_bytes: int = DEFAULT_MIN_BYTES,
    ) -> None:
        self.block_tokens = block_tokens
        self.max_depth = max_depth
        self.max_number_chars = max_number_chars
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self.min_bytes = min_bytes
        self._known: OrderedDict[str | bytes, list[_Known]] = OrderedDict()
        """Remembered bodies by key (a session, or leading bytes), most recent first."""
        self._bytes = 0
        self.extended = 0
        """Bodies parsed only past a remembered prefix, since the cache was built."""
        def refuse(name: str) -> Any:
            raise ValueError(f"{name} is not a JSON number")

        self._scan = json.JSONDecoder(parse_constant=refuse).scan_once

    def __len__(self) -> int:
        return len(self._known)

    @property
    def remembered_bytes(self) -> int:
        return self._bytes

    def parse(self, raw: bytes, session: str | None = None) -> ParsedChat | None:
        """The fields and prompt chain of a chat body, or None when the caller must parse it its usual way."""
        key = session if session is not None else raw[:PROBE_BYTES]
        try:
            for known in self._known.get(key, ()):
                if len(raw) > known.end and raw.startswith(memoryview(known.raw)[: known.end]):
                    parsed = self._extend(raw, known, key)
                    if parsed is not None:
                        return parsed
                    break
            return self._parse_whole(raw, key)
        except (_NotHandled, StopIteration, ValueError, IndexError, RecursionError):
            return None

    # ------------------------------------------------------------------ parsing
    def _member_name(self, s: str, i: int) -> tuple[str, int]:
        """The member name at s[i] and the index of its value (after the `:` and whitespace)."""
        if s[i] != '"':
            raise _NotHandled("expected a member name")
        key, i = self._scan(s, i)
        i = _WS.match(s, i).end()
        if s[i] != ":":
            raise _NotHandled("expected ':'")
        return key, _WS.match(s, i + 1).end()

    def _members(self, s: str, i: int, fields: dict[str, Any]) -> tuple[int, str | None]:
        """Parse the top-level `"key": value` members from s[i] to the object's `}`: (index after it, the JSON
        text of the last `tools` value or None)."""
        tools_json = None
        i = _WS.match(s, i).end()
        while True:
            key, i = self._member_name(s, i)
            if key == "messages":
                raise _NotHandled("messages given twice")
            start = i
            fields[key], i = self._scan(s, i)
            if key == "tools":
                tools_json = s[start:i]
            i = _WS.match(s, i).end()
            if s[i] == "}":
                return i + 1, tools_json
            if s[i] != ",":
                raise _NotHandled("expected ',' or '}'")
            i = _WS.match(s, i + 1).end()

    def _messages(self, s: str, i: int, start_index: int) -> tuple[list[str], int, int]:
        """Render the messages from s[i], just after a message of the array, to the array's `]`: (pieces, index
        after the last message, index after `]`)."""
        pieces: list[str] = []
        last_end = i
        n = start_index
        i = _WS.match(s, i).end()
        if s[i] == "]":
            return pieces, last_end, i + 1
        if s[i] != ",":
            raise _NotHandled("expected ',' or ']'")
        i = _WS.match(s, i + 1).end()
        while True:
            msg, i = self._scan(s, i)
            pieces.append(render_message(n, msg))
            n += 1
            last_end = i
            i = _WS.match(s, i).end()
            if s[i] == "]":
                return pieces, last_end, i + 1
            if s[i] != ",":
                raise _NotHandled("expected ',' or ']'")
            i = _WS.match(s, i + 1).end()

    def _parse_whole(self, raw: bytes, cache_key: str | bytes) -> ParsedChat:
        if raw[:3] == b"\xef\xbb\xbf":
            raise _NotHandled("byte order mark")
        if limit_violation(raw, self.max_depth, self.max_number_chars) is not None:
            raise _NotHandled("over a JSON limit")
        s = raw.decode("utf-8", "surrogatepass")
        i = _WS.match(s, 0).end()
        if s[i] != "{":
            raise _NotHandled("not an object")
        head: dict[str, Any] = {}
        i = _WS.match(s, i + 1).end()
        if s[i] == "}":
            raise _NotHandled("no messages")
        while True:  # the members before `messages`
            key, i = self._member_name(s, i)
            if key == "messages":
                break
            head[key], i = self._scan(s, i)
            i = _WS.match(s, i).end()
            if s[i] != ",":
                raise _NotHandled("no messages")  # `}` before any `messages`, or malformed
            i = _WS.match(s, i + 1).end()
        if s[i] != "[":
            raise _NotHandled("messages is not a list")
        messages, i = self._scan(s, i)  # one scanner call for the array; its last object ends before `]`
        if not messages:
            raise _NotHandled("no messages")
        pieces = [render_message(n, m) for n, m in enumerate(messages)]
        msg_end = i - 1
        while s[msg_end - 1] in " \t\n\r":
            msg_end -= 1
        after: dict[str, Any] = {}
        i, tools_json = self._after_messages(s, i, after)
        fields = {**head, **after}
        tools = fields.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise _NotHandled("tools is not a list")
        prompt = TextChain(self.block_tokens).extend([render_tools(tools), *pieces])
        if "tools" in head and "tools" in after:
            return ParsedChat(fields, prompt)  # tools given twice: not remembered
        end = msg_end if s.isascii() else len(s[:msg_end].encode("utf-8", "surrogatepass"))
        self._remember(cache_key, _Known(raw, end, head, tools_json, prompt, len(pieces)))
        return ParsedChat(fields, prompt)

    def _extend(self, raw: bytes, known: _Known, key: str | bytes) -> ParsedChat | None:
        """Parse a body whose first `known.end` bytes equal the remembered body's."""
        if raw.find(_MESSAGES_KEY, known.end) >= 0:
            return None  # a second `messages` member may follow, or the word in a value: parse whole
        tail = raw[known.end :]
        # the new messages sit in the array at depth 2; members after it (depth 1) are held to the same, stricter
        # bound, and a body refused here for that is parsed whole
        if limit_violation(tail, self.max_depth - 2, self.max_number_chars) is not None:
            return None
        s = tail.decode("utf-8", "surrogatepass")
        pieces, msg_end, i = self._messages(s, 0, known.messages)
        after: dict[str, Any] = {}
        i, tools_json = self._after_messages(s, i, after)
        if tools_json != known.tools_json:
            return None  # the tools, rendered before the messages, differ (or moved): parse whole
        fields = {**known.head, **after}
        prompt = known.prompt.extend(pieces) if pieces else known.prompt
        end = known.end + (msg_end if s.isascii() else len(s[:msg_end].encode("utf-8", "surrogatepass")))
        self._remember(key, _Known(raw, end, known.head, known.tools_json, prompt, known.messages + len(pieces)), known)
        self.extended += 1
        return ParsedChat(fields, prompt, reused_chars=known.prompt.chars)

    def _after_messages(self, s: str, i: int, after: dict[str, Any]) -> tuple[int, str | None]:
        """Parse what follows the messages array's `]` at s[i-1] to the end of the body: (end, tools JSON)."""
        i = _WS.match(s, i).end()
        if s[i] == ",":
            i, tools_json = self._members(s, i + 1, after)
        elif s[i] == "}":
            i, tools_json = i + 1, None
        else:
            raise _NotHandled("expected ',' or '}'")
        if _WS.match(s, i).end() != len(s):
            raise _NotHandled("extra data")
        return i, tools_json

    # ------------------------------------------------------------------ the cache
    def _remember(self, key: str | bytes, known: _Known, replaces: _Known | None = None) -> None:
        """Remember `known` under `key` (in place of `replaces`, the body it extends, when given)."""
        if len(known.raw) < self.min_bytes:
            return
        bodies = self._known.pop(key, [])
        if replaces is not None and any(b is replaces for b in bodies):
            bodies = [b for b in bodies if b is not replaces]
            self._bytes -= len(replaces.raw)
        keep = 1 if isinstance(key, str) else BODIES_PER_PROBE
        bodies.insert(0, known)
        self._bytes += len(known.raw)
        for gone in bodies[keep:]:
            self._bytes -= len(gone.raw)
        self._known[key] = bodies[:keep]
        while self._known and (len(self._known) > self.max_sessions or self._bytes > self.max_bytes):
            _, gone_bodies = self._known.popitem(last=False)
            self._bytes -= sum(len(b.raw) for b in gone_bodies)

    def forget(self, session: str) -> None:
        """Drop what is remembered of a session."""
        self._bytes -= sum(len(b.raw) for b in self._known.pop(session, ()))

