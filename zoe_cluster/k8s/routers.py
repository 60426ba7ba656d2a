"""The router pods of a Helm release, found by label, and the controller's membership push to all of them.

In Kubernetes the router runs as a Deployment of two or more pods (helm/zoe), while the controller (the
single writer of membership) runs as a Ray actor in the RayCluster. The controller therefore finds the router
pods through the API (label selector from $ZOE_K8S_ROUTER_SELECTOR, set by the chart) and pushes the same
versioned membership to PUT /admin/membership on each pod (the router's own port; admin key). A pod that
starts later gets the last membership on the next `publish`/`resync`.

Router pods outlive the controller actor: a controller that Ray restarts counts its membership versions from 0
again, and the routers would refuse its pushes as stale (409). The fanout therefore sends `base + version`, and
when a router answers 409 it reads that router's version and raises `base` above it, then pushes again.

`load()` reads every pod's `GET /admin/load` (a `routing.load_report.LoadReport`) and sums them for the switcher.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from zoe_cluster.router.membership import Membership
from zoe_cluster.routing.load_report import LoadReport


@dataclass(frozen=True)
class RouterEndpoint:
    """One ready router pod's admin API."""

    pod: str
    url: str  # http://<pod IP>:<router port>
    restarts: int = 0  # container restarts: a restarted router has lost its membership

    @property
    def incarnation(self) -> str:
        return f"{self.pod}#{self.restarts}"


def _pod_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _labels_match(labels: dict[str, str], selector: str) -> bool:
    """Equality-based selectors only ("a=b,c=d"); the API server filters too, this guards the result."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.lstrip("=").strip():
            return False
    return True


def ready_router_endpoints(pods: list[dict[str, Any]], selector: str, port: int) -> list[RouterEndpoint]:
    """The ready, addressed pods among `pods` that match `selector`, sorted by name (pure)."""
    out = []
    for p in pods:
        meta = p.get("metadata") or {}
        ip = (p.get("status") or {}).get("podIP")
        if ip and _pod_ready(p) and _labels_match(meta.get("labels") or {}, selector):
            host = f"[{ip}]" if ":" in ip else ip
            restarts = sum(int(c.get("restartCount") or 0) for c in (p.get("status") or {}).get("containerStatuses") or [])
            out.append(RouterEndpoint(pod=meta["name"], url=f"http://{host}:{port}", restarts=restarts))
    return sorted(out, key=lambda e: e.pod)


@dataclass(frozen=True)
class RouterDiscovery:
    """Where to look for router pods: namespace, label selector and the router's port."""

    namespace: str
    selector: str
    port: int

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "RouterDiscovery":
        """From the variables the Helm chart sets on every zoe pod; raises ValueError naming a missing one."""
        env = dict(os.environ if env is None else env)
        missing = [k for k in ("ZOE_K8S_NAMESPACE", "ZOE_K8S_ROUTER_SELECTOR", "ZOE_K8S_ROUTER_PORT") if not env.get(k)]
        if missing:
            raise ValueError(f"not running under the zoe Helm chart: {', '.join(missing)} unset")
        try:
            port = int(env["ZOE_K8S_ROUTER_PORT"])
        except ValueError:
            raise ValueError(f"ZOE_K8S_ROUTER_PORT must be a port number, got {env['ZOE_K8S_ROUTER_PORT']!r}") from None
        return cls(env["ZOE_K8S_NAMESPACE"], env["ZOE_K8S_ROUTER_SELECTOR"], port)

    def endpoints(self, core: Any) -> list[RouterEndpoint]:
        """Ready router pods now (needs `list pods` in the namespace)."""
        resp = core.list_namespaced_pod(
            self.namespace, label_selector=self.selector, _preload_content=False, _request_timeout=10
        )
        return ready_router_endpoints(json.loads(resp.data).get("items") or [], self.selector, self.port)


@dataclass
class PushResult:
    """What one publish did: pods that took the membership, and pods that failed (with the reason)."""

    applied: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


class MembershipFanout:
    """Pushes the controller's membership to every router pod that discovery finds.

    `find` returns the current endpoints (e.g. `lambda: discovery.endpoints(core)`); `http` is an
    `httpx.Client`. Keeps the last membership so `resync()` brings new or restarted router pods up to date.
    """

    def __init__(self, find: Callable[[], list[RouterEndpoint]], admin_token: str | None, http: Any):
        self._find = find
        self._headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self._http = http
        self._last: Membership | None = None
        self._acked: dict[str, int] = {}  # pod incarnation -> controller version it holds
        self.base = 0  # added to the controller's versions (see the module docstring)

    def publish(self, membership: Membership) -> PushResult:
        """Push `membership` to every ready router pod."""
        self._last = membership
        return self._push(membership, only_behind=False)

    def resync(self) -> PushResult:
        """Push the last membership to router pods that do not hold it yet (new or restarted pods)."""
        if self._last is None:
            return PushResult()
        return self._push(self._last, only_behind=True)

    def _put(self, e: RouterEndpoint, m: Membership) -> Any:
        body = m.model_dump(mode="json") | {"version": self.base + m.version}
        return self._http.put(f"{e.url}/admin/membership", json=body, headers=self._headers, timeout=5.0)

    def _rebase_above(self, e: RouterEndpoint, m: Membership) -> None:
        r = self._http.get(f"{e.url}/admin/membership", headers=self._headers, timeout=5.0)
        r.raise_for_status()
        self.base = max(self.base, int(r.json()["version"]) - m.version + 1)

    def _push(self, m: Membership, only_behind: bool) -> PushResult:
        result = PushResult()
        endpoints = self._find()
        live = {e.incarnation for e in endpoints}
        self._acked = {k: v for k, v in self._acked.items() if k in live}
        for e in endpoints:
            if only_behind and self._acked.get(e.incarnation, -1) >= m.version:
                continue
            try:
                r = self._put(e, m)
                if r.status_code == 409:  # the router holds a newer version than base + ours: move base above it
                    self._rebase_above(e, m)
                    r = self._put(e, m)
            except Exception as exc:  # one unreachable pod must not stop the others
                result.failed[e.pod] = f"{type(exc).__name__}: {exc}"
                continue
            if r.status_code == 200:
                result.applied.append(e.pod)
                self._acked[e.incarnation] = m.version
            else:
                result.failed[e.pod] = f"HTTP {r.status_code}: {r.text[:200]}"
        return result

    def load(self) -> LoadReport | None:
        """The router pods' own counts (`GET /admin/load` on each), summed over the pods: each counts only the
        traffic it routed. A pod that does not answer with a report counts nothing; None when none answers."""
        reports = []
        for e in self._find():
            try:
                r = self._http.get(f"{e.url}/admin/load", headers=self._headers, timeout=5.0)
                if r.status_code == 200:
                    reports.append(LoadReport.model_validate_json(r.content))
            except Exception:  # one unreachable pod (or one that answers no report) must not hide the others' load
                continue
        return LoadReport.summed(reports) if reports else None


def fanout_from_env(env: dict[str, str] | None = None, core: Any = None, http: Any = None) -> MembershipFanout | None:
    """The fanout a controller running under the Helm chart uses; None when not under the chart.

    The chart sets ZOE_K8S_* (where the router pods are) and ZOE_ROUTER_ADMIN_KEY (their admin key) on every zoe
    pod, Ray's included. A controller calls `publish(membership)` on every membership change and `resync()` from
    its reconcile loop, next to (or instead of) pushing to a router it started itself.
    """
    env = dict(os.environ if env is None else env)
    try:
        discovery = RouterDiscovery.from_env(env)
    except ValueError:
        return None
    if core is None:
        from zoe_cluster.k8s.api import core_api

        core = core_api()
    if http is None:
        import httpx

        http = httpx.Client()
    return MembershipFanout(lambda: discovery.endpoints(core), env.get("ZOE_ROUTER_ADMIN_KEY"), http)
