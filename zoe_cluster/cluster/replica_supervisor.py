"""Replica supervision: one task per replica index that places, starts, watches, drains and releases its gang.

Each replica index loops: reserve GPUs (placement group) -> start the engine on every node of the gang -> wait for
/health -> watch (process exit, actor loss, hung /health) -> on failure, back off exponentially and start a new
generation; on a planned change (scale down, variant swap, undeploy) drain first, then stop. What happened is
recorded as `ReplicaFacts`; every change of who serves is reported through the `publish` callback (the controller
pushes a new membership). The desired state is read from `spec()` each time, so the controller changes it by
replacing its spec and calling `reconcile`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from zoe_cluster.cluster.intent_store import IntentStore
from zoe_cluster.cluster.lifecycle import ReplicaFacts, backoff_s
from zoe_cluster.cluster.node_actor import NodeMember
from zoe_cluster.cluster.placement import GangShape
from zoe_cluster.cluster.spec import DeploymentSpec
from zoe_cluster.engines import LaunchContext
from zoe_cluster.replica_state import ReplicaState
from zoe_cluster.switching.actuator import FleetReplica

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often a ready replica's process is polled (health checks run at health.check_interval_s)
HISTORY = 20  # ended generations kept per deployment for `zoe status`


class ReplicaFailure(Exception):
    """A replica generation ended badly; `gang_lost` means its actors or GPUs are gone and must be re-placed."""

    def __init__(self, reason: str, gang_lost: bool = False, exit_code: int | None = None):
        super().__init__(reason)
        self.gang_lost = gang_lost
        self.exit_code = exit_code


class Superseded(Exception):
    """The desired state changed (removed, or another variant) before this generation became ready."""


@dataclass
class Gang:
    """A replica's reserved GPUs and the actor on each of its nodes."""

    shape: GangShape
    pg: object
    members: list
    infos: list[dict]


@dataclass
class Slot:
    """Everything kept about one replica index."""

    index: int
    facts: ReplicaFacts | None = None
    gang: Gang | None = None
    task: asyncio.Task | None = None
    remove: bool = False
    generation: int = 0
    restarts: int = 0
    failures_in_a_row: int = 0
    last_swap_at: float | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class ReplicaSupervisor:
    """The replicas of one deployment. `publish()` is awaited after every change of who serves; `router_in_flight`
    tells the requests the router still has open to a replica id (None when it cannot tell)."""

    def __init__(self, spec: Callable[[], DeploymentSpec], intent: IntentStore, log_dir: Path, ray_address: str,
                 publish: Callable[[], Awaitable[None]],
                 router_in_flight: Callable[[str], Awaitable[int | None]]):
        self._spec = spec
        self.intent, self.log_dir, self.ray_address = intent, log_dir, ray_address
        self.publish, self.router_in_flight = publish, router_in_flight
        self.slots: dict[int, Slot] = {}
        self.history: list[ReplicaFacts] = []
        self.closing = False
        self._http: httpx.AsyncClient | None = None

    @property
    def spec(self) -> DeploymentSpec:
        return self._spec()

    # ---- what the controller reads ------------------------------------------------------------------------------
    def current(self) -> list[ReplicaFacts]:
        """The facts of each replica index's current generation, in index order."""
        return [s.facts for s in sorted(self.slots.values(), key=lambda s: s.index) if s.facts is not None]

    def ended(self) -> list[ReplicaFacts]:
        """Ended generations, oldest first (the last HISTORY)."""
        return self.history[-HISTORY:]

    def indices(self) -> list[int]:
        """The replica indices supervised now (those being removed included)."""
        return sorted(self.slots)

    def fleet(self) -> list[FleetReplica]:
        """What the recipe switcher sees per replica (indices being removed left out)."""
        return [FleetReplica(s.index, s.facts.id, s.facts.variant, s.facts.state().value, s.last_swap_at)
                for s in sorted(self.slots.values(), key=lambda s: s.index) if s.facts is not None and not s.remove]

    # ---- what the controller asks -------------------------------------------------------------------------------
    def reconcile(self) -> None:
        """Make the set of supervising tasks match `spec.replicas`; restart a task that died unexpectedly."""
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.spec.health.check_timeout_s)
        for i in range(self.spec.replicas):
            slot = self.slots.setdefault(i, Slot(index=i))
            slot.remove = False
            if slot.task is None or slot.task.done():
                slot.task = asyncio.create_task(self._supervise(slot))
        for i, slot in list(self.slots.items()):
            if i >= self.spec.replicas and not slot.remove:
                slot.remove = True
                slot.wake.set()
            if slot.remove and slot.task is not None and slot.task.done():
                del self.slots[i]

    def request_swap(self, index: int, variant: str, reason: str = "") -> ReplicaFacts | None:
        """Wake replica `index` so that it rolls to the variant the spec now names for it (drain first); returns
        its current generation's facts."""
        slot = self.slots[index]
        if slot.facts is not None and slot.facts.variant != variant:
            slot.last_swap_at = time.time()
            slot.facts.note("swap requested", f"to {variant}" + (f": {reason}" if reason else ""))
        slot.wake.set()
        return slot.facts

    async def wait_serving(self, index: int, variant: str, timeout_s: float) -> ReplicaFacts:
        """Until replica `index` is ready on `variant`; RuntimeError if that generation failed, TimeoutError."""
        slot = self.slots[index]
        deadline = time.monotonic() + timeout_s
        while True:
            f = slot.facts
            if f is not None and f.variant == variant:
                if f.state() == ReplicaState.READY:
                    return f
                if f.state() == ReplicaState.FAILED:
                    raise RuntimeError(f"replica {f.id} failed on {variant}: {f.failure}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"replica {index} not ready on {variant} in time")
            try:
                await asyncio.wait_for(slot.changed.wait(), min(left, 1.0))
            except asyncio.TimeoutError:
                pass

    async def logs(self, index: int | None, max_bytes: int) -> dict[str, str]:
        """The tail of each replica's engine log (replica index -> text; every node rank of a multi-node gang)."""
        out: dict[str, str] = {}
        for i, slot in sorted(self.slots.items()):
            if index is not None and i != index:
                continue
            if slot.gang is None:
                state = slot.facts.state().value if slot.facts else "-"
                out[str(i)] = f"(replica {i} has no running node actors: {state})"
                continue
            parts = []
            for rank, m in enumerate(slot.gang.members):
                try:
                    text = await asyncio.wait_for(m.log_tail.remote(max_bytes), 10)
                except Exception as e:  # noqa: BLE001
                    text = f"(log unavailable: {type(e).__name__})"
                parts.append(text if len(slot.gang.members) == 1 else f"--- node rank {rank} ---\n{text}")
            out[str(i)] = "\n".join(parts)
        return out

    async def stop_all(self, timeout_s: float) -> None:
        """Drain and stop every replica (their tasks end), then free every gang; the caller set `replicas` to 0."""
        for slot in self.slots.values():
            slot.remove = True
            slot.wake.set()
        tasks = [s.task for s in self.slots.values() if s.task is not None]
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=timeout_s)
            for t in pending:
                t.cancel()
        for slot in self.slots.values():
            await self._release(slot)
        self.closing = True

    # ---- one replica ----------------------------------------------------------------------------------------
    async def _supervise(self, slot: Slot) -> None:
        h = self.spec.health
        slot.generation = max(slot.generation, self.intent.last_generation(slot.index))
        while not slot.remove and not self.closing:
            variant = self.spec.variant_of(slot.index)
            slot.generation += 1
            self.intent.record_generation(slot.index, slot.generation)  # ids stay unique across controller restarts
            facts = ReplicaFacts(self.spec.name, slot.index, slot.generation, variant, self.spec.pool(variant),
                                 created_at=time.time(), restarts=slot.restarts)
            self._begin(slot, facts)
            try:
                await self._place(slot, facts)
                await self._start_engine(slot, facts)
                await self._wait_ready(slot, facts)
                await self._watch(slot, facts)
            except Superseded:
                await self._stop(slot, facts, drain=False)
                continue
            except (ReplicaFailure, Exception) as e:  # noqa: BLE001 - anything unforeseen fails this generation only
                if not isinstance(e, ReplicaFailure):
                    log.exception("replica %s: unexpected error", facts.id)
                    e = ReplicaFailure(f"controller error: {type(e).__name__}: {e}", gang_lost=True)
                await self._fail(slot, facts, e)
                slot.restarts += 1
                slot.failures_in_a_row += 1
                delay = backoff_s(slot.failures_in_a_row, h.backoff_base_s, h.backoff_cap_s)
                facts.note("backoff", f"next start in {delay:.1f}s")
                await self._sleep_or_wake(slot, delay)
                continue
            except asyncio.CancelledError:
                await self._stop(slot, facts, drain=False)
                raise
            await self._stop(slot, facts, drain=facts.ready_at is not None)
        await self._release(slot)

    def _begin(self, slot: Slot, facts: ReplicaFacts) -> None:
        if slot.facts is not None:
            self.history.append(slot.facts)
            del self.history[:-HISTORY]
        slot.facts = facts
        facts.note("created", f"variant {facts.variant}")
        self._changed(slot)

    def _superseded(self, slot: Slot, facts: ReplicaFacts) -> bool:
        return slot.remove or self.closing or self.spec.variant_of(slot.index) != facts.variant

    async def _place(self, slot: Slot, facts: ReplicaFacts) -> None:
        """Reserve the replica's GPUs (reusing the gang when the shape is unchanged) and learn where they are."""
        import ray
        from ray.util import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        shape = self.spec.shape(facts.variant)
        if slot.gang is not None and slot.gang.shape != shape:
            await self._release(slot)
        if slot.gang is None:
            pg = placement_group(shape.bundles(), strategy=shape.strategy,
                                 name=f"zoe:{self.spec.name}:{slot.index}:{facts.generation}")
            try:
                await self._until(pg.ready(), self.spec.health.placement_timeout_s, slot, facts)
            except asyncio.TimeoutError:
                ray.util.remove_placement_group(pg)
                raise ReplicaFailure(f"no room for {shape.nodes}x{shape.gpus_per_node} GPUs "
                                     f"after {self.spec.health.placement_timeout_s:.0f}s", gang_lost=True) from None
            except BaseException:
                ray.util.remove_placement_group(pg)
                raise
            member_cls = ray.remote(NodeMember)
            members = [
                member_cls.options(
                    num_cpus=0, num_gpus=shape.member_gpus, max_restarts=0, max_concurrency=4,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=rank),
                ).remote(f"{self.spec.name}/{slot.index}", rank, str(self.log_dir))
                for rank in range(shape.members)
            ]
            slot.gang = Gang(shape, pg, members, [])
            try:
                slot.gang.infos = list(await asyncio.wait_for(
                    asyncio.gather(*[m.info.remote() for m in members]), 120))
            except Exception as e:  # noqa: BLE001 - actor could not start
                raise ReplicaFailure(f"node actors did not start: {e}", gang_lost=True) from None
        facts.placed_at = time.time()
        facts.nodes = [i["node_ip"] for i in slot.gang.infos]
        facts.gpu_ids = [list(i["gpu_ids"]) for i in slot.gang.infos]
        facts.member_pids = [i["pid"] for i in slot.gang.infos]
        facts.note("placed", f"{shape.nodes} node(s) x {shape.gpus_per_node} GPUs ({shape.strategy})")
        self._changed(slot)

    def _platform(self, info: dict) -> str:
        if self.spec.platform != "auto":
            return self.spec.platform
        return "cpu" if self.spec.adapter().is_simulated else info["platform"]

    async def _start_engine(self, slot: Slot, facts: ReplicaFacts) -> None:
        gang, spec = slot.gang, self.spec
        adapter = spec.adapter()
        head = gang.infos[0]
        host = spec.host or head["node_ip"]
        try:
            port = await gang.members[0].free_port.remote(host)
            dist = f"{head['node_ip']}:{await gang.members[0].free_port.remote(host)}" if gang.shape.nodes > 1 else None
            kv_port = (await gang.members[0].free_port.remote(host)
                       if spec.router.kv_events and not adapter.is_simulated else None)
            started = []
            for rank, (member, info) in enumerate(zip(gang.members, gang.infos)):
                ctx = LaunchContext(
                    gpu_ids=tuple(info["gpu_ids"]), platform=self._platform(info), host=host, port=port,
                    served_model_name=spec.recipe.served_model_name, node_rank=rank, nnodes=gang.shape.nodes,
                    dist_init_addr=dist, model_path=spec.model_path, max_model_len=spec.max_model_len,
                    launcher=tuple(spec.launcher) if spec.launcher else None,
                    extra_env=dict(spec.engine_env), host_kv_gb=spec.host_kv_gb,
                    kv_events_port=kv_port, replica_id=facts.id,
                )
                cmd = adapter.command(spec.recipe, facts.variant, ctx)
                argv = cmd.argv + list(spec.engine_args) if cmd.argv else []
                env = dict(cmd.env)
                if gang.shape.engine_places_workers and self.ray_address:
                    env.setdefault("RAY_ADDRESS", self.ray_address)  # vLLM's Ray executor joins this cluster
                log_name = f"{spec.name}-replica{slot.index}-rank{rank}.log"
                started.append(await member.start.remote(argv, env, log_name))
        except ReplicaFailure:
            raise
        except Exception as e:  # noqa: BLE001 - RayActorError, or a bad command from the adapter
            raise ReplicaFailure(f"engine start failed: {e}", gang_lost=_is_actor_error(e)) from None
        facts.url = f"http://{host}:{port}"
        facts.kv_events_port = kv_port
        facts.pids = [p["pid"] for p in started if p is not None and p["pid"] is not None]
        facts.process_groups = [p["process_group"] for p in started if p is not None]
        facts.started_at = time.time()
        facts.note("started", facts.url)
        self._changed(slot)

    async def _health(self, url: str) -> str | None:
        """None when the engine's health endpoint answers 200, else why not."""
        try:
            r = await self._http.get(url + self.spec.adapter().health_path, timeout=self.spec.health.check_timeout_s)
        except httpx.HTTPError as e:
            return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        return None if r.status_code == 200 else f"/health answered {r.status_code}"

    async def _metrics(self, facts: ReplicaFacts):
        """The engine's /metrics as `EngineStats`, or None when it does not answer 200."""
        try:
            r = await self._http.get(facts.url + "/metrics", timeout=self.spec.health.check_timeout_s)
        except httpx.HTTPError:
            return None
        return self.spec.adapter().parse_metrics(r.text, time.time()) if r.status_code == 200 else None

    async def _scrape_kernels(self, facts: ReplicaFacts) -> None:
        """Which zoe kernels the engine reports active, from its /metrics (the plugin's `zoe_kernel_active`)."""
        stats = await self._metrics(facts)
        if stats is not None:
            facts.kernels_active, facts.metrics_scraped_at = list(stats.zoe_kernels_active), stats.scraped_at

    async def _exit_codes(self, slot: Slot) -> None:
        """Raise ReplicaFailure if any engine process of the gang exited or any member actor is gone."""
        try:
            codes = await asyncio.wait_for(asyncio.gather(*[m.poll.remote() for m in slot.gang.members]),
                                           self.spec.health.check_timeout_s * 2)
        except asyncio.TimeoutError:
            raise ReplicaFailure("node actor did not answer a poll in time (node lost?)", gang_lost=True) from None
        except Exception as e:  # noqa: BLE001
            if _is_actor_error(e):
                raise ReplicaFailure(f"node actor died: {type(e).__name__}", gang_lost=True) from None
            raise
        for rank, code in enumerate(codes):
            if code is not None:
                raise ReplicaFailure(f"engine on node rank {rank} exited with code {code}", exit_code=code)

    async def _wait_ready(self, slot: Slot, facts: ReplicaFacts) -> None:
        deadline = time.monotonic() + self.spec.health.load_timeout_s
        while True:
            if self._superseded(slot, facts):
                raise Superseded()
            await self._exit_codes(slot)
            why = await self._health(facts.url)
            if why is None:
                break
            facts.last_health_error = why
            if time.monotonic() > deadline:
                raise ReplicaFailure(f"not ready after {self.spec.health.load_timeout_s:.0f}s: {why}")
            await self._sleep_or_wake(slot, POLL_S * 2)
        now = time.time()
        facts.ready_at = facts.last_health_ok_at = now
        facts.last_health_error = None
        facts.note("ready", f"after {now - facts.started_at:.1f}s")
        self._changed(slot)
        await self.publish()

    async def _watch(self, slot: Slot, facts: ReplicaFacts) -> None:
        """Return when the replica should stop on purpose; raise ReplicaFailure on crash, actor loss or hang."""
        h = self.spec.health
        next_check = time.monotonic() + h.check_interval_s
        while not self._superseded(slot, facts):
            await self._exit_codes(slot)
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + h.check_interval_s
                why = await self._health(facts.url)
                if why is None:
                    facts.last_health_ok_at, facts.health_failures_in_a_row, facts.last_health_error = time.time(), 0, None
                    await self._scrape_kernels(facts)
                else:
                    facts.health_failures_in_a_row += 1
                    facts.last_health_error = why
                    if facts.health_failures_in_a_row >= h.failures_to_restart:
                        raise ReplicaFailure(f"hung: {facts.health_failures_in_a_row} failed health checks ({why})")
            if slot.failures_in_a_row and time.time() - facts.ready_at >= h.stable_after_s:
                slot.failures_in_a_row = 0
            await self._sleep_or_wake(slot, POLL_S)

    async def _fail(self, slot: Slot, facts: ReplicaFacts, e: ReplicaFailure) -> None:
        facts.failed_at = time.time()
        facts.failure = str(e)
        facts.exit_code = e.exit_code
        facts.note("failed", str(e))
        log.warning("replica %s failed: %s", facts.id, e)
        self._changed(slot)
        await self.publish()  # out of routing first, then clean up
        if e.gang_lost:
            await self._release(slot)
        else:
            await self._stop_engines(slot)

    async def _stop(self, slot: Slot, facts: ReplicaFacts, drain: bool) -> None:
        if drain and facts.url:
            await self._drain(slot, facts)
        await self._stop_engines(slot)
        facts.stopped_at = time.time()
        facts.note("stopped")
        self._changed(slot)
        await self.publish()

    async def _drain(self, slot: Slot, facts: ReplicaFacts) -> None:
        """Stop routing to the replica, then wait (bounded) until neither the router nor the engine has work."""
        facts.drain_requested_at = time.time()
        facts.note("draining")
        self._changed(slot)
        await self.publish()
        deadline = time.monotonic() + self.spec.health.drain_timeout_s
        await asyncio.sleep(POLL_S)  # a request the router picked just before the push reaches the engine
        while time.monotonic() < deadline:
            if await self._in_flight(facts) == 0:
                facts.note("drained")
                return
            await asyncio.sleep(POLL_S)
        facts.note("drain timeout", f"stopping with work in flight after {self.spec.health.drain_timeout_s:.0f}s")

    async def _in_flight(self, facts: ReplicaFacts) -> int:
        """The larger of the router's open requests to the replica and the engine's running + waiting ones."""
        counts = [await self.router_in_flight(facts.id)]
        stats = await self._metrics(facts)
        if stats is not None:
            counts.append(int(stats.running + stats.waiting))
        known = [c for c in counts if c is not None]
        return max(known) if known else 0

    async def _stop_members(self, members: list, extra_s: float) -> bool:
        """Ask every node actor to stop its engine (each stops its whole process group, SIGKILL after the grace);
        False when they did not all answer within the grace + `extra_s`."""
        grace = self.spec.health.stop_grace_s
        try:
            await asyncio.wait_for(asyncio.gather(*[m.stop.remote(grace) for m in members], return_exceptions=True),
                                   grace + extra_s)
        except asyncio.TimeoutError:
            return False
        return True

    async def _stop_engines(self, slot: Slot) -> None:
        """Stop the gang's engines and keep its GPUs (a restart or swap reuses them); release the gang when its
        actors do not answer."""
        if slot.gang is not None and not await self._stop_members(slot.gang.members, 10.0):
            await self._release(slot)  # killing the actors makes their process supervisors kill the engines

    async def _release(self, slot: Slot) -> None:
        """Stop the gang's engines, kill its actors (their process supervisors then kill any engine left) and free
        its GPUs."""
        import ray

        gang, slot.gang = slot.gang, None
        if gang is None:
            return
        await self._stop_members(gang.members, 5.0)
        for m in gang.members:
            try:
                ray.kill(m, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        try:
            ray.util.remove_placement_group(gang.pg)
        except Exception:  # noqa: BLE001
            pass

    async def _until(self, awaitable, timeout_s: float, slot: Slot, facts: ReplicaFacts):
        """Await `awaitable` up to `timeout_s`, giving up early (Superseded) if the desired state changes."""
        fut = asyncio.ensure_future(awaitable)
        deadline = time.monotonic() + timeout_s
        while not fut.done():
            if self._superseded(slot, facts):
                fut.cancel()
                raise Superseded()
            left = deadline - time.monotonic()
            if left <= 0:
                fut.cancel()
                raise asyncio.TimeoutError()
            await asyncio.wait([fut], timeout=min(left, POLL_S * 2))
        return fut.result()

    async def _sleep_or_wake(self, slot: Slot, seconds: float) -> None:
        if seconds <= 0:
            return
        try:
            await asyncio.wait_for(slot.wake.wait(), seconds)
        except asyncio.TimeoutError:
            pass
        slot.wake.clear()

    def _changed(self, slot: Slot) -> None:
        slot.changed.set()
        slot.changed = asyncio.Event()


def _is_actor_error(e: BaseException) -> bool:
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

    return isinstance(e, (RayActorError, ActorDiedError, ActorUnavailableError))
