"""The deployment controller: one detached, named Ray actor per deployment that keeps replicas at the desired state.

Each replica index has a supervising task that loops: reserve GPUs (placement group) -> start the engine on
every node of the gang -> wait for /health -> watch (process exit, actor loss, hung /health) -> on failure,
back off exponentially and start a new generation; on a planned change (scale down, variant swap, undeploy)
drain first, then stop. Every change of who serves is pushed to the router as a new membership version.
The CLI finds controllers by name in the "zoe" namespace; everything it shows comes from `status()`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from zoe_cluster.cluster.lifecycle import ReplicaFacts, ReplicaState, backoff_s
from zoe_cluster.cluster.node_actor import NodeMember, default_log_dir
from zoe_cluster.cluster.placement import GangShape, fits_cluster
from zoe_cluster.cluster.router_link import RouterLink, router_argv
from zoe_cluster.cluster.spec import DeploymentSpec
from zoe_cluster.engines import LaunchContext, get_adapter
from zoe_cluster.recipes.profile import host_kv_tokens
from zoe_cluster.router.membership import Membership

log = logging.getLogger(__name__)

NAMESPACE = "zoe"
CONTROLLER_PREFIX = "zoe-controller:"
KV_PREFIX = "zoe/deployment/"
POLL_S = 0.25  # how often a ready replica's process is polled (health checks run at health.check_interval_s)
HISTORY = 20  # ended generations kept per deployment for `zoe status`


def _summed(*parts: dict[str, float] | None) -> dict[str, float] | None:
    """Counts of several routers added key by key; None when none of them counts."""
    given = [p for p in parts if p is not None]
    if not given:
        return None
    out: dict[str, float] = {}
    for p in given:
        for k, n in p.items():
            out[k] = out.get(k, 0.0) + n
    return out


def _k8s_fanout():
    """The membership fan-out to the Helm release's router pods, when running under the chart (else None)."""
    try:
        from zoe_cluster.k8s import fanout_from_env

        return fanout_from_env()
    except Exception:  # noqa: BLE001 - no in-cluster credentials: not under the chart after all
        log.exception("ZOE_K8S_* is set but the Kubernetes API is not reachable; router pods get no membership")
        return None


def controller_name(deployment: str) -> str:
    return CONTROLLER_PREFIX + deployment


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
    """Everything the controller keeps about one replica index."""

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


class DeploymentController:
    """Wrapped with `ray.remote` (see `controller_actor_class`); plain so tests can read it as a class."""

    def __init__(self, spec_json: str, ray_address: str = ""):
        spec = DeploymentSpec.model_validate_json(spec_json)
        # Ray re-runs __init__ with the original arguments when it restarts this actor: resume the latest intent
        # (after scale/switch) from Ray's key-value store instead.
        stored = _kv_get(KV_PREFIX + spec.name) if _reconstructed() else None
        self.spec = DeploymentSpec.model_validate_json(stored) if stored else spec
        self.ray_address = ray_address
        self.created_at = time.time()
        self.adapter = get_adapter(self.spec.engine)
        self.slots: dict[int, Slot] = {}
        self.history: list[ReplicaFacts] = []
        # Versions stay monotonic across controller restarts (a router that outlived us rejects older pushes).
        self.membership_version = int(time.time() * 1000)
        self.router: RouterLink | None = None
        self.router_error: str | None = None
        self.router_restarts = 0
        self.log_dir = Path(self.spec.log_dir) if self.spec.log_dir else default_log_dir()
        self._loop: asyncio.Task | None = None
        self._push_lock: asyncio.Lock | None = None
        self._http: httpx.AsyncClient | None = None
        self._closing = False
        self.switch_loop = None
        self._switch_task: asyncio.Task | None = None
        self.fanout = _k8s_fanout()
        self._last_resync = 0.0
        self.metrics_url: str | None = None
        self._persist()
        self._generations: dict[str, int] = json.loads(_kv_get(KV_PREFIX + spec.name + "/generations") or "{}") \
            if stored else {}
        if stored:
            self._resume_after_restart()

    def _resume_after_restart(self) -> None:
        """A controller Ray restarted has nobody to call `start()`: start itself once its event loop runs."""
        try:
            asyncio.get_running_loop().create_task(self.start())
            return
        except RuntimeError:
            pass
        import threading

        def kick() -> None:  # outside the loop thread: ask the actor to call its own start()
            import ray

            try:
                ray.get_runtime_context().current_actor.start.remote()
            except Exception:  # noqa: BLE001
                log.exception("could not resume the deployment after a controller restart")

        threading.Timer(0.5, kick).start()

    # ---- lifecycle of the controller itself -------------------------------------------------------------
    async def start(self) -> dict:
        """Start the router and the reconcile loop (idempotent); returns `status()`."""
        if self._loop is None:
            self._push_lock = asyncio.Lock()
            self._http = httpx.AsyncClient(timeout=self.spec.health.check_timeout_s)
            if self.spec.router.enabled:
                await self._start_router()
            self._loop = asyncio.create_task(self._reconcile_forever())
            self._start_switching()
        return self.status()

    def _start_switching(self) -> None:
        """Run the recipe switcher (zoe_cluster.switching) and serve its metrics, when the spec asks for them."""
        from prometheus_client import CollectorRegistry, start_http_server

        cfg = self.spec.switching
        registry = CollectorRegistry()
        if cfg is not None and cfg.enabled:
            from zoe_cluster.switching.loop import SwitchLoop

            self.switch_loop = SwitchLoop(self.spec.recipe, cfg, self, registry)
            self._switch_task = asyncio.create_task(self.switch_loop.run_forever())
        if self.spec.metrics_port is not None:
            import ray

            host = "127.0.0.1" if self.spec.router.host.startswith("127.") else ray.util.get_node_ip_address()
            server, _thread = start_http_server(self.spec.metrics_port, addr=host, registry=registry)
            self.metrics_url = f"http://{host}:{server.server_port}/metrics"

    async def _start_router(self) -> None:
        import ray

        rc = self.spec.router
        host = ray.util.get_node_ip_address() if rc.host in ("0.0.0.0", "::") else rc.host
        if self.router is None:
            self.router = RouterLink(f"http://{host}:{rc.port}")
        policy, policy_args = self.spec.router_policy_args()
        argv = router_argv(rc.host, rc.port, policy, [self.spec.recipe.served_model_name], policy_args + rc.extra_args)
        self.router.start(argv, self.log_dir / f"{self.spec.name}-router.log")
        try:
            await self.router.wait_ready()
        except (RuntimeError, TimeoutError) as e:
            self.router_error = str(e)
            raise
        self.router_error = None

    async def _keep_router_up(self) -> None:
        """A router that exited is started again on the same port and given the current membership."""
        code = self.router.exited() if self.router is not None else None
        if code is None or self._closing:
            return
        log.warning("router exited with %s: restarting it", code)
        self.router_restarts += 1
        self.router.pushed_version = -1
        try:
            await self._start_router()
        except (RuntimeError, TimeoutError):
            return  # tried again on the next tick
        await self._push_membership()

    async def _reconcile_forever(self) -> None:
        while not self._closing:
            try:
                self._reconcile()
                await self._keep_router_up()
                if self.fanout is not None and time.monotonic() - self._last_resync > 5.0:
                    self._last_resync = time.monotonic()
                    await asyncio.to_thread(self.fanout.resync)
            except Exception:  # noqa: BLE001 - the loop must outlive any one bad tick
                log.exception("reconcile tick failed")
            await asyncio.sleep(POLL_S)

    def _reconcile(self) -> None:
        """Make the set of supervising tasks match `spec.replicas`; restart a task that died unexpectedly."""
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

    # ---- one replica ----------------------------------------------------------------------------------------
    async def _supervise(self, slot: Slot) -> None:
        h = self.spec.health
        slot.generation = max(slot.generation, self._generations.get(str(slot.index), 0))
        while not slot.remove and not self._closing:
            variant = self.spec.variant_of(slot.index)
            slot.generation += 1
            self._generations[str(slot.index)] = slot.generation  # ids stay unique across controller restarts
            _kv_put(KV_PREFIX + self.spec.name + "/generations", json.dumps(self._generations))
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
        return slot.remove or self._closing or self.spec.variant_of(slot.index) != facts.variant

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
        return "cpu" if self.adapter.is_simulated else info["platform"]

    async def _start_engine(self, slot: Slot, facts: ReplicaFacts) -> None:
        gang = slot.gang
        head = gang.infos[0]
        host = self.spec.host or head["node_ip"]
        try:
            port = await gang.members[0].free_port.remote(host)
            dist = f"{head['node_ip']}:{await gang.members[0].free_port.remote(host)}" if gang.shape.nodes > 1 else None
            pids = []
            for rank, (member, info) in enumerate(zip(gang.members, gang.infos)):
                ctx = LaunchContext(
                    gpu_ids=tuple(info["gpu_ids"]), platform=self._platform(info), host=host, port=port,
                    served_model_name=self.spec.recipe.served_model_name, node_rank=rank, nnodes=gang.shape.nodes,
                    dist_init_addr=dist, model_path=self.spec.model_path, max_model_len=self.spec.max_model_len,
                    launcher=tuple(self.spec.launcher) if self.spec.launcher else None,
                    extra_env=dict(self.spec.engine_env), host_kv_gb=self.spec.host_kv_gb,
                )
                cmd = self.adapter.command(self.spec.recipe, facts.variant, ctx)
                argv = cmd.argv + list(self.spec.engine_args) if cmd.argv else []
                env = dict(cmd.env)
                if gang.shape.engine_places_workers and self.ray_address:
                    env.setdefault("RAY_ADDRESS", self.ray_address)  # vLLM's Ray executor joins this cluster
                log_name = f"{self.spec.name}-replica{slot.index}-rank{rank}.log"
                pids.append(await member.start.remote(argv, env, log_name))
        except ReplicaFailure:
            raise
        except Exception as e:  # noqa: BLE001 - RayActorError, or a bad command from the adapter
            raise ReplicaFailure(f"engine start failed: {e}", gang_lost=_is_actor_error(e)) from None
        facts.url = f"http://{host}:{port}"
        facts.pids = pids
        facts.started_at = time.time()
        facts.note("started", facts.url)
        self._changed(slot)

    async def _health(self, url: str) -> str | None:
        """None when /health answers 200, else why not."""
        try:
            r = await self._http.get(url + self.adapter.health_path, timeout=self.spec.health.check_timeout_s)
        except httpx.HTTPError as e:
            return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        return None if r.status_code == 200 else f"/health answered {r.status_code}"

    async def _scrape_kernels(self, facts: ReplicaFacts) -> None:
        """Which zoe kernels the engine reports active, from its /metrics (the plugin's `zoe_kernel_active`)."""
        try:
            r = await self._http.get(facts.url + "/metrics", timeout=self.spec.health.check_timeout_s)
        except httpx.HTTPError:
            return
        if r.status_code == 200:
            stats = self.adapter.parse_metrics(r.text, time.time())
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
        await self._push_membership()

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
        await self._push_membership()  # out of routing first, then clean up
        if e.gang_lost:
            await self._release(slot)
        else:
            await self._stop_processes(slot)

    async def _stop(self, slot: Slot, facts: ReplicaFacts, drain: bool) -> None:
        if drain and facts.url:
            await self._drain(slot, facts)
        await self._stop_processes(slot)
        facts.stopped_at = time.time()
        facts.note("stopped")
        self._changed(slot)
        await self._push_membership()

    async def _drain(self, slot: Slot, facts: ReplicaFacts) -> None:
        """Stop routing to the replica, then wait (bounded) until neither the router nor the engine has work."""
        facts.drain_requested_at = time.time()
        facts.note("draining")
        self._changed(slot)
        await self._push_membership()
        deadline = time.monotonic() + self.spec.health.drain_timeout_s
        await asyncio.sleep(POLL_S)  # a request the router picked just before the push reaches the engine
        while time.monotonic() < deadline:
            busy = await self._in_flight(facts)
            if busy == 0:
                facts.note("drained")
                return
            await asyncio.sleep(POLL_S)
        facts.note("drain timeout", f"stopping with work in flight after {self.spec.health.drain_timeout_s:.0f}s")

    async def _in_flight(self, facts: ReplicaFacts) -> int | None:
        counts = []
        if self.router is not None:
            counts.append(await self.router.active_requests(facts.id))
        try:
            r = await self._http.get(facts.url + "/metrics", timeout=self.spec.health.check_timeout_s)
            if r.status_code == 200:
                stats = self.adapter.parse_metrics(r.text, time.time())
                counts.append(int(stats.running + stats.waiting))
        except httpx.HTTPError:
            pass
        known = [c for c in counts if c is not None]
        return max(known) if known else 0

    async def _stop_processes(self, slot: Slot) -> None:
        if slot.gang is None:
            return
        grace = self.spec.health.stop_grace_s
        try:
            await asyncio.wait_for(asyncio.gather(*[m.stop.remote(grace) for m in slot.gang.members],
                                                  return_exceptions=True), grace + 10)
        except asyncio.TimeoutError:
            await self._release(slot)  # killing the actors makes their supervisors kill the engines

    async def _release(self, slot: Slot) -> None:
        """Kill the gang's actors (their supervisors then kill any engine left) and free its GPUs."""
        import ray

        gang, slot.gang = slot.gang, None
        if gang is None:
            return
        grace = self.spec.health.stop_grace_s
        try:
            await asyncio.wait_for(asyncio.gather(*[m.stop.remote(grace) for m in gang.members],
                                                  return_exceptions=True), grace + 5)
        except asyncio.TimeoutError:
            pass
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

    # ---- membership -------------------------------------------------------------------------------------------
    def membership(self) -> dict:
        """The router's view: every ready or draining replica, with its variant and pool."""
        reps = []
        for slot in sorted(self.slots.values(), key=lambda s: s.index):
            f = slot.facts
            if f is None or f.url is None:
                continue
            state = f.state()
            if state not in (ReplicaState.READY, ReplicaState.DRAINING):
                continue
            v = self.spec.recipe.variant(f.variant)
            reps.append({
                "id": f.id, "url": f.url, "pool": f.pool, "variant": f.variant, "state": state.value,
                "engine": self.spec.engine, "models": [self.spec.recipe.served_model_name],
                "max_active_requests": v.max_num_seqs,
                "kv_capacity_tokens": self._kv_tokens(f.variant),
                "host_kv_capacity_tokens": host_kv_tokens(self.spec.recipe, f.variant, self.spec.host_kv_gb),
                "max_context_tokens": self.spec.max_model_len or self.spec.recipe.architecture.max_context_tokens,
            })
        return {"version": self.membership_version, "replicas": reps}

    def _kv_tokens(self, variant: str) -> int:
        """KV capacity the router sizes its prefix index to (the adapter's: a simulated engine may override it)."""
        return self.adapter.kv_capacity_tokens(self.spec.recipe, variant, self.spec.engine_env)

    async def _push_membership(self) -> None:
        self.membership_version += 1
        if self.fanout is not None:  # under the Helm chart: every router pod of the release gets it too
            try:
                await asyncio.to_thread(self.fanout.publish, Membership.model_validate(self.membership()))
            except Exception:  # noqa: BLE001 - a pod that cannot be reached now is caught up by resync()
                log.exception("pushing membership to the release's router pods failed")
        if self.router is None:
            return
        async with self._push_lock:
            for attempt in range(3):
                if await self.router.push(self.membership()):
                    return
                await asyncio.sleep(0.2 * (attempt + 1))

    # ---- what the CLI and the switcher call ----------------------------------------------------------------------
    def status(self) -> dict:
        import ray

        now = time.time()
        current = [s.facts.to_dict(now) for s in sorted(self.slots.values(), key=lambda s: s.index) if s.facts]
        for d in current:
            d["events"] = [e for e in d["events"][-8:]]
        return {
            "deployment": self.spec.name, "model": self.spec.recipe.name, "engine": self.spec.engine,
            "variant": self.spec.variant, "replicas_desired": self.spec.replicas,
            "replica_variants": {str(k): v for k, v in self.spec.replica_variants.items()},
            "replicas_ready": sum(1 for d in current if d["state"] == "ready"),
            "endpoint": (self.router.url + "/v1") if self.router else None,
            "router_url": self.router.url if self.router else None,
            "router_error": self.router_error, "router_restarts": self.router_restarts,
            "served_model_name": self.spec.recipe.served_model_name,
            "membership_version": self.membership_version,
            "ray_address": self.ray_address, "controller_node": ray.util.get_node_ip_address(),
            "created_at": self.created_at, "now": now,
            "replicas": current,
            "switching": self.switch_loop.report() if self.switch_loop else None,
            "metrics_url": self.metrics_url,
            "history": [f.to_dict(now) | {"events": []} for f in self.history[-HISTORY:]],
        }

    def get_spec(self) -> str:
        return self.spec.model_dump_json()

    def membership_view(self) -> dict:
        return self.membership()

    async def scale(self, replicas: int) -> dict:
        """Keep `replicas` replicas; refuses a count the cluster's GPUs can never hold."""
        import ray

        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        why = fits_cluster(self.spec.shape(self.spec.variant), replicas, ray.cluster_resources())
        if why and replicas > self.spec.replicas:
            raise ValueError(why)
        self.spec = self.spec.model_copy(update={"replicas": replicas})
        self._persist()
        self._reconcile()
        return self.status()

    async def switch(self, variant: str, indices: list[int] | None = None, wait: bool = True) -> dict:
        """Roll replicas (all, or `indices`) to `variant`, one at a time, drain first (the manual override)."""
        self._check_variant(variant)
        targets = sorted(self.slots) if indices is None else indices
        if indices is None:
            # New replicas get the new variant at once; running ones keep theirs until their turn, so only one
            # replica at a time is out of service.
            overrides = dict(self.spec.replica_variants)
            for i, slot in self.slots.items():
                if slot.facts is not None:
                    overrides.setdefault(i, slot.facts.variant)
            self.spec = self.spec.model_copy(update={"variant": variant, "replica_variants": overrides})
            self._persist()
        for i in targets:
            await self.swap_replica(i, variant, wait=wait)
        return self.status()

    def fleet(self) -> list[dict]:
        """What the recipe switcher sees per replica: index, replica_id, variant, state, last_swap_at."""
        return [
            {"index": s.index, "replica_id": s.facts.id, "variant": s.facts.variant, "state": s.facts.state().value,
             "last_swap_at": s.last_swap_at}
            for s in sorted(self.slots.values(), key=lambda s: s.index) if s.facts is not None and not s.remove
        ]

    async def in_flight(self) -> dict[str, float]:
        """Requests in flight per replica id, as the routers count them now: the deployment's own router plus,
        under the Helm chart, every router pod (each counts the traffic it routed); empty without a router."""
        own = await self.router.active_by_replica() if self.router is not None else {}
        pods = await self._pod_counts("active_by_replica")
        return _summed(own, pods) or {}

    async def in_flight_by_class(self) -> dict[str, float] | None:
        """Requests in flight per service class (the routers' `slo` policy counts them); None without them."""
        own = await self.router.in_flight_by_class() if self.router is not None else None
        return _summed(own, await self._pod_counts("in_flight_by_class"))

    async def prefill_tokens_by_class(self) -> dict[str, float] | None:
        """Uncached prompt tokens routed so far per service class (cumulative); None without them."""
        own = await self.router.prefill_tokens_by_class() if self.router is not None else None
        return _summed(own, await self._pod_counts("prefill_tokens_by_class"))

    async def _pod_counts(self, key: str) -> dict[str, float] | None:
        """One of the Helm release's router pods' summed counts (`MembershipFanout.load`); None off Kubernetes."""
        if self.fanout is None:
            return None
        try:
            return (await asyncio.to_thread(self.fanout.load))[key]
        except Exception:  # the Kubernetes API or a pod may be away; the own router's counts still stand
            log.warning("router pods' load could not be read", exc_info=True)
            return None

    async def swap_replica(self, index: int, variant: str, wait: bool = True, timeout_s: float | None = None,
                           reason: str = "") -> dict:
        """Drain replica `index`, stop it, start `variant` on the same GPUs (when the shape allows), wait ready.

        With `wait=False` it returns as soon as the swap has begun (the switcher's actuator does that). Returns
        the new generation's facts (as `status()` shows them). Raises TimeoutError if it is not ready in
        `timeout_s` (default: load + drain timeouts), and RuntimeError if the new generation failed.
        """
        self._check_variant(variant)
        if index not in self.slots or index >= self.spec.replicas:
            raise ValueError(f"deployment {self.spec.name} has no replica {index} (replicas: {self.spec.replicas})")
        overrides = dict(self.spec.replica_variants)
        if variant == self.spec.variant:
            overrides.pop(index, None)
        else:
            overrides[index] = variant
        self.spec = self.spec.model_copy(update={"replica_variants": overrides})
        self._persist()
        slot = self.slots[index]
        if slot.facts is not None and slot.facts.variant != variant:
            slot.last_swap_at = time.time()
            slot.facts.note("swap requested", f"to {variant}" + (f": {reason}" if reason else ""))
        slot.wake.set()
        if not wait:
            return slot.facts.to_dict() if slot.facts else {}
        deadline = time.monotonic() + (timeout_s or self.spec.health.load_timeout_s + self.spec.health.drain_timeout_s)
        while True:
            f = slot.facts
            if f is not None and f.variant == variant:
                if f.state() == ReplicaState.READY:
                    return f.to_dict()
                if f.state() == ReplicaState.FAILED:
                    raise RuntimeError(f"replica {f.id} failed on {variant}: {f.failure}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"replica {index} not ready on {variant} in time")
            try:
                await asyncio.wait_for(slot.changed.wait(), min(left, 1.0))
            except asyncio.TimeoutError:
                pass

    def _check_variant(self, variant: str) -> None:
        if variant not in self.spec.recipe.variants:
            raise ValueError(f"model {self.spec.recipe.name} has no variant '{variant}'; "
                             f"known: {sorted(self.spec.recipe.variants)}")
        engine = self.spec.recipe.variants[variant].engine
        if not self.adapter.serves(engine):
            raise ValueError(f"variant '{variant}' runs on {engine}; this deployment runs {self.spec.engine}")
        self.spec.worker_image(variant)  # a variant no worker image of the cluster runs is refused here

    async def logs(self, index: int | None = None, max_bytes: int = 20_000) -> dict[str, str]:
        """The tail of each engine log (replica index -> text), or the router's log with index -1."""
        out: dict[str, str] = {}
        if index == -1:
            p = self.router.log_path if self.router else None
            return {"router": _tail(p, max_bytes) if p else ""}
        for i, slot in sorted(self.slots.items()):
            if index is not None and i != index:
                continue
            if slot.gang is None:
                out[str(i)] = f"(replica {i} has no running node actors: {slot.facts.state().value if slot.facts else '-'})"
                continue
            parts = []
            for rank, m in enumerate(slot.gang.members):
                try:
                    text = await asyncio.wait_for(m.log_tail.remote(max_bytes), 10)
                except Exception as e:  # noqa: BLE001
                    text = f"(log unavailable: {type(e).__name__})"
                parts.append(text if len(slot.gang.members) == 1 else f"--- node rank {rank} ---\n{text}")
            out[str(i)] = "\n".join(parts)
        if index is not None and not out:
            raise ValueError(f"deployment {self.spec.name} has no replica {index}")
        return out

    async def wait_ready(self, timeout_s: float) -> dict:
        """Block until every desired replica is ready (or timeout); returns `status()`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            st = self.status()
            if st["replicas_ready"] >= self.spec.replicas:
                return st
            await asyncio.sleep(POLL_S)
        return self.status()

    async def shutdown(self) -> dict:
        """Drain and stop every replica, stop the router, free every GPU; the caller then kills this actor."""
        if self._switch_task is not None:
            self._switch_task.cancel()  # no swap may start while everything is being removed
        self.spec = self.spec.model_copy(update={"replicas": 0})
        for slot in self.slots.values():
            slot.remove = True
            slot.wake.set()
        tasks = [s.task for s in self.slots.values() if s.task is not None]
        h = self.spec.health
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=h.drain_timeout_s + h.stop_grace_s + 30)
            for t in pending:
                t.cancel()
        for slot in self.slots.values():
            await self._release(slot)
        self._closing = True
        if self._loop is not None:
            self._loop.cancel()
        if self.router is not None:
            await self.router.close(h.stop_grace_s)
        _kv_del(KV_PREFIX + self.spec.name)
        _kv_del(KV_PREFIX + self.spec.name + "/generations")
        return self.status()

    def _persist(self) -> None:
        _kv_put(KV_PREFIX + self.spec.name, self.spec.model_dump_json())


def _tail(path: Path, max_bytes: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _reconstructed() -> bool:
    try:
        import warnings

        import ray

        with warnings.catch_warnings():  # Ray's own property trips its own deprecation warning
            warnings.simplefilter("ignore")
            return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # noqa: BLE001 - outside an actor
        return False


def _is_actor_error(e: BaseException) -> bool:
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

    return isinstance(e, (RayActorError, ActorDiedError, ActorUnavailableError))


def _kv_get(key: str) -> str | None:
    try:
        from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_initialized

        if not _internal_kv_initialized():
            return None
        v = _internal_kv_get(key.encode())
        return v.decode() if v else None
    except Exception:  # noqa: BLE001 - outside Ray (unit tests)
        return None


def _kv_put(key: str, value: str) -> None:
    try:
        from ray.experimental.internal_kv import _internal_kv_initialized, _internal_kv_put

        if _internal_kv_initialized():
            _internal_kv_put(key.encode(), value.encode(), overwrite=True)
    except Exception:  # noqa: BLE001
        pass


def _kv_del(key: str) -> None:
    try:
        from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_initialized

        if _internal_kv_initialized():
            _internal_kv_del(key.encode())
    except Exception:  # noqa: BLE001
        pass
