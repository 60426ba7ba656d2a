"""Client-facing errors in OpenAI's shape, the one shape the router and the engines answer with:

    {"error": {"message": str, "type": str, "param": str | None, "code": int}}

vLLM's server and the simulated engine answer exactly these four keys (vLLM's `ErrorResponse`); the router's own
errors use OpenAI's type names (`invalid_request_error`, ...). An engine's error that is not in this shape (a
plain-text 500, an HTML page from a proxy) is rewrapped by the router with `upstream_error_body`.
"""

from __future__ import annotations

import json


class HttpError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", retry_after: int | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.retry_after, self.param = status, message, kind, retry_after, param


def error_body(message: str, kind: str, status: int, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": status}}).encode()


def is_error_shape(data: bytes) -> bool:
    """Whether an error body already is `{"error": {"message": ..., ...}}`."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and isinstance(obj.get("error"), dict) and isinstance(obj["error"].get("message"), str)


def upstream_error_body(status: int, data: bytes, replica_id: str) -> bytes:
    """An engine's error response in the one shape: kept as it is when it already has it, else wrapped (the
    engine's text, cut to 500 characters, becomes the message)."""
    if is_error_shape(data):
        return data
    text = data[:500].decode("utf-8", "replace").strip() or f"HTTP {status}"
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return error_body(f"replica {replica_id} answered HTTP {status}: {text}", kind, status)
