"""The deployment controller: one detached, named Ray actor per deployment, its operator API and reconcile loop.

The controller wires the parts that do the work and holds the desired state (`spec`): `ReplicaSupervisor` keeps
the replicas at it (place, start, watch, drain, release each gang), `MembershipPublisher` tells the routers who
serves, `RouterProcess` runs the deployment's router, `IntentStore` keeps the spec in Ray's key-value store so a
controller Ray restarts resumes the latest intent, and `LiveFleet` lets the recipe switcher read the load and
swap replicas. The CLI finds controllers by name in the "zoe" namespace; everything it shows comes from `status()`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from zoe_cluster.cluster.fleet_load import FleetLoadReader, LiveFleet
from zoe_cluster.cluster.intent_store import IntentStore
from zoe_cluster.cluster.membership_publisher import MembershipPublisher, k8s_fanout
from zoe_cluster.cluster.node_actor import default_log_dir
from zoe_cluster.cluster.placement import fits_cluster
from zoe_cluster.cluster.replica_supervisor import POLL_S, ReplicaSupervisor
from zoe_cluster.cluster.router_link import RouterLink, RouterProcess
from zoe_cluster.cluster.spec import DeploymentSpec

log = logging.getLogger(__name__)

NAMESPACE = "zoe"
CONTROLLER_PREFIX = "zoe-controller:"


def controller_name(deployment: str) -> str:
    return CONTROLLER_PREFIX + deployment


class DeploymentController:
    """Wrapped with `ray.remote` (see `client.controller_actor_class`); plain so tests can read it as a class."""

    def __init__(self, spec_json: str, ray_address: str = ""):
        spec = DeploymentSpec.model_validate_json(spec_json)
        self.intent = IntentStore(spec.name)
        # Ray re-runs __init__ with the original arguments when it restarts this actor: resume the latest intent
        # (after scale/switch) from Ray's key-value store instead.
        stored = self.intent.load_spec() if _reconstructed() else None
        self.spec = stored or spec
        self.ray_address = ray_address
        self.created_at = time.time()
        self.log_dir = Path(self.spec.log_dir) if self.spec.log_dir else default_log_dir()
        self.router: RouterProcess | None = None
        fanout = k8s_fanout()
        self.replicas = ReplicaSupervisor(lambda: self.spec, self.intent, self.log_dir, ray_address,
                                          publish=self._publish, router_in_flight=self._router_in_flight)
        self.membership = MembershipPublisher(lambda: self.spec, self.replicas.current, self._router_link, fanout)
        self.load = FleetLoadReader(self._router_link, fanout)
        self.metrics_url: str | None = None
        self.switch_loop = None
        self._switch_task: asyncio.Task | None = None
        self._loop: asyncio.Task | None = None
        self._closing = False
        self.intent.save_spec(self.spec)
        if stored:
            self.intent.resume_generations()
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

    def _router_link(self) -> RouterLink | None:
        return self.router.link if self.router is not None else None

    async def _router_in_flight(self, replica_id: str) -> int | None:
        link = self._router_link()
        return await link.active_requests(replica_id) if link is not None else None

    async def _publish(self) -> None:
        await self.membership.publish()

    # ---- lifecycle of the controller itself -------------------------------------------------------------
    async def start(self) -> dict:
        """Start the router, the reconcile loop and the switcher (idempotent); returns `status()`."""
        if self._loop is None:
            if self.spec.router.enabled:
                self.router = RouterProcess(self.spec, self.log_dir / f"{self.spec.name}-router.log")
                await self.router.start()
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

            fleet = LiveFleet(self.replicas.fleet, self.load,
                              lambda index, variant, reason: self.swap_replica(index, variant, reason=reason))
            self.switch_loop = SwitchLoop(self.spec.recipe, cfg, fleet, registry)
            self._switch_task = asyncio.create_task(self.switch_loop.run_forever())
        if self.spec.metrics_port is not None:
            import ray

            host = "127.0.0.1" if self.spec.router.host.startswith("127.") else ray.util.get_node_ip_address()
            server, _thread = start_http_server(self.spec.metrics_port, addr=host, registry=registry)
            self.metrics_url = f"http://{host}:{server.server_port}/metrics"

    async def _reconcile_forever(self) -> None:
        while not self._closing:
            try:
                self.replicas.reconcile()
                if self.router is not None and not self._closing and await self.router.restarted():
                    await self._publish()
                await self.membership.resync()
            except Exception:  # noqa: BLE001 - the loop must outlive any one bad tick
                log.exception("reconcile tick failed")
            await asyncio.sleep(POLL_S)

    def _set_spec(self, **update) -> None:
        """Change the desired state and store it (a restarted controller resumes it)."""
        self.spec = self.spec.model_copy(update=update)
        self.intent.save_spec(self.spec)

    # ---- what the CLI and the switcher call ----------------------------------------------------------------------
    def status(self) -> dict:
        import ray

        now = time.time()
        current = [f.to_dict(now) for f in self.replicas.current()]
        for d in current:
            d["events"] = d["events"][-8:]
        link = self._router_link()
        return {
            "deployment": self.spec.name, "model": self.spec.recipe.name, "engine": self.spec.engine,
            "variant": self.spec.variant, "replicas_desired": self.spec.replicas,
            "replica_variants": {str(k): v for k, v in self.spec.replica_variants.items()},
            "replicas_ready": sum(1 for d in current if d["state"] == "ready"),
            "endpoint": (link.url + "/v1") if link else None,
            "router_url": link.url if link else None,
            "router_error": self.router.error if self.router else None,
            "router_restarts": self.router.restarts if self.router else 0,
            "served_model_name": self.spec.recipe.served_model_name,
            "membership_version": self.membership.version,
            "ray_address": self.ray_address, "controller_node": ray.util.get_node_ip_address(),
            "created_at": self.created_at, "now": now,
            "replicas": current,
            "switching": self.switch_loop.report() if self.switch_loop else None,
            "metrics_url": self.metrics_url,
            "history": [f.to_dict(now) | {"events": []} for f in self.replicas.ended()],
        }

    def get_spec(self) -> str:
        return self.spec.model_dump_json()

    def membership_view(self) -> dict:
        """The membership the routers hold now (the `Membership` model as JSON)."""
        return self.membership.current().model_dump(mode="json")

    def fleet(self) -> list[dict]:
        """What the recipe switcher sees per replica: index, replica_id, variant, state, last_swap_at."""
        return [{"index": r.index, "replica_id": r.replica_id, "variant": r.variant, "state": r.state,
                 "last_swap_at": r.last_swap_at} for r in self.replicas.fleet()]

    async def in_flight(self) -> dict[str, int]:
        """Requests in flight per replica id, as the routers count them now (the own router plus, under the Helm
        chart, every router pod); empty when no router answers."""
        report = await self.load.read()
        return report.in_flight if report is not None else {}

    async def scale(self, replicas: int) -> dict:
        """Keep `replicas` replicas; refuses a count the cluster's GPUs can never hold."""
        import ray

        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        why = fits_cluster(self.spec.shape(self.spec.variant), replicas, ray.cluster_resources())
        if why and replicas > self.spec.replicas:
            raise ValueError(why)
        self._set_spec(replicas=replicas)
        self.replicas.reconcile()
        return self.status()

    async def switch(self, variant: str, indices: list[int] | None = None, wait: bool = True) -> dict:
        """Roll replicas (all, or `indices`) to `variant`, one at a time, drain first (the manual override)."""
        self._check_variant(variant)
        targets = self.replicas.indices() if indices is None else indices
        if indices is None:
            # New replicas get the new variant at once; running ones keep theirs until their turn, so only one
            # replica at a time is out of service.
            overrides = dict(self.spec.replica_variants)
            for f in self.replicas.current():
                overrides.setdefault(f.index, f.variant)
            self._set_spec(variant=variant, replica_variants=overrides)
        for i in targets:
            await self.swap_replica(i, variant, wait=wait)
        return self.status()

    async def swap_replica(self, index: int, variant: str, wait: bool = True, timeout_s: float | None = None,
                           reason: str = "") -> dict:
        """Drain replica `index`, stop it, start `variant` on the same GPUs (when the shape allows), wait ready.

        With `wait=False` it returns as soon as the swap has begun. Returns the new generation's facts (as
        `status()` shows them). Raises TimeoutError if it is not ready in `timeout_s` (default: load + drain
        timeouts), and RuntimeError if the new generation failed.
        """
        self._check_variant(variant)
        if index not in self.replicas.indices() or index >= self.spec.replicas:
            raise ValueError(f"deployment {self.spec.name} has no replica {index} (replicas: {self.spec.replicas})")
        overrides = dict(self.spec.replica_variants)
        if variant == self.spec.variant:
            overrides.pop(index, None)
        else:
            overrides[index] = variant
        self._set_spec(replica_variants=overrides)
        facts = self.replicas.request_swap(index, variant, reason)
        if not wait:
            return facts.to_dict() if facts else {}
        h = self.spec.health
        facts = await self.replicas.wait_serving(index, variant, timeout_s or h.load_timeout_s + h.drain_timeout_s)
        return facts.to_dict()

    def _check_variant(self, variant: str) -> None:
        if variant not in self.spec.recipe.variants:
            raise ValueError(f"model {self.spec.recipe.name} has no variant '{variant}'; "
                             f"known: {sorted(self.spec.recipe.variants)}")
        engine = self.spec.recipe.variants[variant].engine
        if not self.spec.adapter().serves(engine):
            raise ValueError(f"variant '{variant}' runs on {engine}; this deployment runs {self.spec.engine}")
        self.spec.worker_image(variant)  # a variant no worker image of the cluster runs is refused here

    async def logs(self, index: int | None = None, max_bytes: int = 20_000) -> dict[str, str]:
        """The tail of each engine log (replica index -> text), or the router's log with index -1."""
        if index == -1:
            link = self._router_link()
            return {"router": _tail(link.log_path, max_bytes) if link and link.log_path else ""}
        out = await self.replicas.logs(index, max_bytes)
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
        h = self.spec.health
        await self.replicas.stop_all(h.drain_timeout_s + h.stop_grace_s + 30)
        self._closing = True
        if self._loop is not None:
            self._loop.cancel()
        if self.router is not None:
            await self.router.close(h.stop_grace_s)
        self.intent.clear()
        return self.status()


def _tail(path: Path, max_bytes: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
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
