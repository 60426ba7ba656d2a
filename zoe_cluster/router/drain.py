"""Graceful SIGTERM for the router process: what a Kubernetes rolling update or scale-down sends.

    server = DrainingServer(uvicorn.Config(router.app, ...), router)
    server.run()

On the first SIGTERM the router marks itself draining: /health answers 503 (readiness fails, so the Service's
endpoints drop the pod) while the router still serves for `drain_delay_s`, covering the seconds before every node's
proxy and load balancer has stopped sending it new connections. Every response it starts while draining carries
`connection: close`, so clients stop reusing their keep-alive connections: a connection closed while idle can
meet a request the client is just sending on it, which then fails with nothing received, and a client cannot tell
that from a request cut mid-way. Then uvicorn's own shutdown runs: the listener
closes, idle keep-alive connections are closed, busy ones close after their response, and the process waits up to
`drain_timeout_s` for in-flight requests and streams to finish (longer ones are cut), then stops the router (its
picture is saved) and exits. A second SIGTERM, or SIGINT, skips what is left of the delay. The chart's
`terminationGracePeriodSeconds` must exceed drain_delay_s + drain_timeout_s, or the kubelet's SIGKILL cuts the
drain short.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn

if TYPE_CHECKING:
    from zoe_cluster.router.app import Router


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the drain delay in front of its graceful shutdown (module docstring)."""

    def __init__(self, config: uvicorn.Config, router: "Router") -> None:
        super().__init__(config)
        self.router = router
        self.exit_at: float | None = None
        """Monotonic time at which the listener closes (set by the first SIGTERM)."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        delay = self.router.config.drain_delay_s
        if sig == signal.SIGTERM and self.exit_at is None and delay > 0:
            self.router.draining = True
            self.exit_at = time.monotonic() + delay
            return
        self.router.draining = True
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self.exit_at is not None and time.monotonic() >= self.exit_at:
            self.should_exit = True
        return await super().on_tick(counter)


def closing_connection(send: Callable[[dict], Awaitable[None]]) -> Callable[[dict], Awaitable[None]]:
    """An ASGI `send` whose response start carries `connection: close` (uvicorn then closes the connection after
    the response)."""

    async def send_closing(message: dict) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)

    return send_closing


def uvicorn_drain_kwargs(router: "Router") -> dict:
    """uvicorn.Config arguments for the drain: the bound on waiting for in-flight requests."""
    return {"timeout_graceful_shutdown": router.config.drain_timeout_s}
