"""Client-facing errors of the router, in OpenAI's shape: {"error": {"message", "type", "code"}}."""

from __future__ import annotations

import json


class HttpError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.retry_after = status, message, kind, retry_after


def error_body(message: str, kind: str, status: int) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
