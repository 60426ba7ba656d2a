"""Active health checks and engine-stats scrapes, one loop per router.

Every `health_interval_s` each replica's GET /health is called (`health_timeout_s`); `unhealthy_after` failures
in a row take it out of rotation, one success brings it back (and lifts a passive ejection early). With
`scrape_metrics`, the replica's /metrics is parsed by its engine adapter (`zoe_cluster.engines`) into
`ReplicaView.stats`, which the prefix policy reads when the scrape is fresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

from zoe_cluster.router.config import RouterConfig
from zoe_cluster.router.loop_task import LoopTask
from zoe_cluster.router.replicas import RoutedReplica

if TYPE_CHECKING:
    from zoe_cluster.router.app import Router


def _parser(engine: str):
    try:
        from zoe_cluster.engines import get_adapter

        return get_adapter(engine).parse_metrics
    except (ImportError, ValueError):  # an adapter not built yet: no stats, health still checked
        return None


class HealthChecker(LoopTask):
    def __init__(self, router: "Router", config: RouterConfig) -> None:
        self.router = router
        self.config = config
        self._kick = asyncio.Event()
        self._parsers: dict[str, object] = {}

    def start(self) -> None:
        if self.config.health_interval_s > 0:
            self._start_loop()

    async def stop(self) -> None:
        await self._stop_loop()

    def kick(self) -> None:
        """Check now (after a membership change) instead of at the next period."""
        self._kick.set()

    async def _loop(self) -> None:
        while True:
            await self.check_all()
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.health_interval_s):
                    await self._kick.wait()

    async def check_all(self) -> None:
        states = list(self.router.replicas)
        if states:
            await asyncio.gather(*(self.check(st) for st in states), return_exceptions=True)

    async def check(self, st: RoutedReplica) -> None:
        pool = self.router.upstream
        if pool is None or st.removed:
            return
        ok = False
        try:
            async with asyncio.timeout(self.config.health_timeout_s):
                status, _ = await self._get(pool, st.member.url + "/health")
                ok = status == 200
        except OSError:  # refused, reset, timeout
            ok = False
        if st.removed:
            return
        self.router.replicas.record_health(st, ok)
        if ok and self.config.scrape_metrics:
            await self._scrape(st)

    async def _scrape(self, st: RoutedReplica) -> None:
        engine = st.member.engine
        if engine not in self._parsers:
            self._parsers[engine] = _parser(engine)
        parse = self._parsers[engine]
        pool = self.router.upstream
        if parse is None or pool is None:
            return
        try:
            async with asyncio.timeout(self.config.health_timeout_s):
                status, body = await self._get(pool, st.member.url + "/metrics")
            if status == 200:
                st.view.stats = parse(body.decode("utf-8", "replace"), time.time())  # type: ignore[operator]
        except (OSError, ValueError):
            pass

    @staticmethod
    async def _get(pool, url: str) -> tuple[int, bytes]:
        resp = await pool.request("GET", url)
        try:
            body = await resp.read()
        except BaseException:
            resp.close()
            raise
        resp.release()
        return resp.status, body
