"""The controller's side of the router: start it as a process the controller owns, push membership, read load
(`GET /admin/load`, a `routing.load_report.LoadReport`).

The controller is the single writer of membership (zoe_cluster.router.membership): every change (a replica
ready, draining, gone) becomes a new `Membership` with a higher version, PUT to the router's admin endpoint
with the admin key. The router runs under `supervisor`, so it dies with the controller.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sys
from pathlib import Path

import httpx

from zoe_cluster.cluster.process_group import spawn_supervised
from zoe_cluster.cluster.spec import DeploymentSpec
from zoe_cluster.router.config import RouterConfig
from zoe_cluster.router.membership import Membership
from zoe_cluster.routing.load_report import LoadReport

log = logging.getLogger(__name__)


SECRET_FIELDS = {"admin_key", "api_keys"}
"""RouterConfig fields that never go on a command line: they travel in ZOE_ROUTER_ADMIN_KEY / ZOE_ROUTER_API_KEYS."""


def router_argv(config: RouterConfig) -> list[str]:
    """The router process's command line: `zoe router --config-json` with the whole typed config (its fields win
    over the command's flags), less the keys, which travel in the environment."""
    body = config.model_dump_json(exclude=SECRET_FIELDS)
    return [sys.executable, "-m", "zoe_cluster.cli.main", "router", "--config-json", body]


class RouterLink:
    """Owns one router process and talks to its admin API."""

    def __init__(self, url: str, admin_key: str | None = None):
        self.url = url.rstrip("/")
        self.admin_key = admin_key or secrets.token_urlsafe(24)
        self.proc = None
        self.log_path: Path | None = None
        self.pushed_version = -1
        self._client = httpx.AsyncClient(timeout=5.0, headers={"Authorization": f"Bearer {self.admin_key}"})

    def start(self, argv: list[str], log_path: Path) -> None:
        if self.proc is not None:
            self.proc.stop(1.0)
        self.log_path = log_path
        env = {**os.environ, "ZOE_ROUTER_ADMIN_KEY": self.admin_key}
        self.proc = spawn_supervised(argv, env, log_path)

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    async def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            if self.exited() is not None:
                raise RuntimeError(f"router exited with {self.exited()}; log: {self.log_path}")
            try:
                r = await self._client.get(self.url + "/admin/membership")
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
        raise TimeoutError(f"router not answering at {self.url} after {timeout_s:.0f}s; log: {self.log_path}")

    async def push(self, membership: Membership) -> bool:
        """PUT a membership; True when applied or already superseded (409), False when the router did not answer."""
        if membership.version <= self.pushed_version:
            return True
        try:
            r = await self._client.put(self.url + "/admin/membership", json=membership.model_dump(mode="json"))
        except httpx.HTTPError as e:
            log.warning("membership push v%s failed: %s", membership.version, e)
            return False
        if r.status_code in (200, 409):
            self.pushed_version = max(self.pushed_version, membership.version)
            return True
        log.warning("membership push v%s answered %s: %s", membership.version, r.status_code, r.text[:300])
        return False

    async def load(self) -> LoadReport | None:
        """The router's counts (`GET /admin/load`): in flight per replica id and per service class, uncached prompt
        tokens per class; None when the router does not answer with a report."""
        try:
            r = await self._client.get(self.url + "/admin/load")
            return LoadReport.model_validate_json(r.content) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):  # pydantic's ValidationError is a ValueError
            return None

    async def active_requests(self, replica_id: str) -> int | None:
        """In-flight requests the router has open to `replica_id`, or None when it cannot tell."""
        load = await self.load()
        return load.in_flight.get(replica_id, 0) if load is not None and load.in_flight else None

    async def close(self, grace_s: float = 5.0) -> None:
        await self._client.aclose()
        if self.proc is not None:
            await asyncio.to_thread(self.proc.stop, grace_s)
            self.proc = None



class RouterProcess:
    """The router a deployment owns: started on its spec's address, started again (same port) when it exits."""

    def __init__(self, spec: DeploymentSpec, log_path: Path):
        self.spec, self.log_path = spec, log_path
        self.link: RouterLink | None = None
        self.error: str | None = None
        """Why the router last failed to start (None once it answers)."""
        self.restarts = 0

    async def start(self) -> None:
        """Start the router process and wait until it answers; RuntimeError/TimeoutError (also kept in `error`)."""
        import ray

        rc = self.spec.router
        host = ray.util.get_node_ip_address() if rc.host in ("0.0.0.0", "::") else rc.host
        if self.link is None:
            self.link = RouterLink(f"http://{host}:{rc.port}")
        self.link.start(router_argv(self.spec.router_config()), self.log_path)
        try:
            await self.link.wait_ready()
        except (RuntimeError, TimeoutError) as e:
            self.error = str(e)
            raise
        self.error = None

    async def restarted(self) -> bool:
        """Start the router again if its process exited; True when it runs again (it then needs the membership)."""
        code = self.link.exited() if self.link is not None else None
        if code is None:
            return False
        log.warning("router exited with %s: restarting it", code)
        self.restarts += 1
        self.link.pushed_version = -1
        try:
            await self.start()
        except (RuntimeError, TimeoutError):
            return False  # tried again on the next tick
        return True

    async def close(self, grace_s: float) -> None:
        if self.link is not None:
            await self.link.close(grace_s)
