"""The router's non-proxy endpoints (a Starlette app): /health, /v1/models, /metrics and the admin API.

The admin API (membership push, drain, the load report) needs the admin bearer key and is disabled (403) without
one; see `zoe_cluster.router.membership` for the membership contract, `zoe_cluster.routing.load_report` for the
load's. `GET /admin/picture` answers the router's picture, the membership it applied and where its logs are
(`shared_from`), in the picture file's format (`zoe_cluster.router.picture_store`), for a peer router starting
without one; `POST /admin/picture/delta` the prefix-index chains it inserted and the sessions it routed since the
numbers a peer sends (`zoe_cluster.router.picture_sharing`). `GET /admin/membership` also shows the policy's
`describe()`, which is debug output: nothing parses it.
/metrics needs the `metrics_key` bearer key when one is set. Every error is in the one shape of
`zoe_cluster.router.errors`.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

import msgpack
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zoe_cluster.config_errors import validation_problems
from zoe_cluster.router.errors import error_body
from zoe_cluster.router.membership import Membership
from zoe_cluster.router.picture_sharing import DELTA_PATH, delta_document, parse_delta_request, share_position
from zoe_cluster.router.picture_store import PICTURE_MEDIA_TYPE, PICTURE_PATH, capture_picture, picture_summary
from zoe_cluster.router.replicas import StaleMembership

if TYPE_CHECKING:
    from zoe_cluster.router.app import Router


def _error(status: int, message: str, kind: str) -> Response:
    return Response(error_body(message, kind, status), status_code=status, media_type="application/json")


async def _not_found(request: Request, exc: Exception) -> Response:
    return _error(404, f"no route {request.method} {request.url.path}", "not_found_error")


async def _method_not_allowed(request: Request, exc: Exception) -> Response:
    return _error(405, f"method {request.method} not allowed on {request.url.path}", "invalid_request_error")


async def _internal_error(request: Request, exc: Exception) -> Response:
    return _error(500, f"internal router error: {type(exc).__name__}: {exc}", "server_error")


class AuxRoutes:
    """Endpoints other than the proxied /v1 POSTs, bound to one router."""

    def __init__(self, router: "Router") -> None:
        self.router = router
        self.app = Starlette(routes=self._routes(), exception_handlers={404: _not_found, 405: _method_not_allowed, 500: _internal_error})

    def _routes(self) -> list[Route]:
        return [
            Route("/health", self._health, methods=["GET"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/metrics", self._metrics, methods=["GET"]),
            Route("/admin/membership", self._admin_membership, methods=["GET", "PUT"]),
            Route("/admin/load", self._admin_load, methods=["GET"]),
            Route(PICTURE_PATH, self._admin_picture, methods=["GET"]),
            Route(DELTA_PATH, self._admin_picture_delta, methods=["POST"]),
            Route("/admin/replicas/{replica_id:path}/drain", self._admin_drain, methods=["POST"]),
            Route("/admin/replicas/{replica_id:path}/undrain", self._admin_drain, methods=["POST"]),
        ]

    async def _health(self, request: Request) -> Response:
        now = self.router.clock()
        routable = sum(1 for st in self.router.replicas if st.routable(now))
        draining = self.router.draining  # SIGTERM: load balancers take the router out while it finishes
        return JSONResponse({"status": "draining" if draining else "ok", "replicas": len(self.router.replicas.by_id),
                             "routable": routable, "membership_version": self.router.replicas.version},
                            status_code=503 if draining else 200)

    async def _models(self, request: Request) -> Response:
        if self.router._api_keys:
            auth = request.headers.get("authorization", "")
            if not auth.startswith("Bearer ") or auth[7:].strip().encode() not in self.router._api_keys:
                return _error(401, "missing or invalid API key", "authentication_error")
        data = [{"id": m, "object": "model", "owned_by": "zoe"} for m in sorted(self.router.served_models())]
        return JSONResponse({"object": "list", "data": data})

    async def _metrics(self, request: Request) -> Response:
        key = self.router.config.metrics_key
        if key is not None and not hmac.compare_digest(request.headers.get("authorization", "").encode(),
                                                       f"Bearer {key}".encode()):
            return _error(401, "missing or invalid metrics key", "authentication_error")
        return Response(generate_latest(self.router.registry), media_type=CONTENT_TYPE_LATEST)

    def _admin_denied(self, request: Request) -> Response | None:
        if self.router._admin_auth is None:
            return _error(403, "the admin API is disabled: start the router with an admin key", "permission_error")
        if not hmac.compare_digest(request.headers.get("authorization", "").encode(), self.router._admin_auth):
            return _error(401, "missing or invalid admin key", "authentication_error")
        return None

    async def _admin_membership(self, request: Request) -> Response:
        if (denied := self._admin_denied(request)) is not None:
            return denied
        if request.method == "GET":
            out = {"version": self.router.replicas.version, "policy": self.router.policy.describe(),
                   "replicas": self.router.replicas.describe()}
            if self.router.kv_events is not None:
                out["kv_events"] = {rid: {"engine_blocks": m.blocks, "block_size": m.block_size, "gaps": m.gaps,
                                          **m.history} for rid, m in self.router.kv_events.mirrors.items()}
            out["picture"] = picture_summary(self.router)
            if self.router.sharer is not None:
                out["picture_sharing"] = self.router.sharer.describe()
            return JSONResponse(out)
        raw = await request.body()
        try:
            m = Membership.model_validate_json(raw)
        except ValidationError as e:
            return _error(400, f"invalid membership: {validation_problems(e, whole='body')}", "invalid_request_error")
        try:
            changes = self.router.apply_membership(m)
        except StaleMembership as e:
            return _error(409, str(e), "conflict")
        self.router.health.kick()
        return JSONResponse({"version": m.version, "replicas": len(m.replicas), **changes})

    async def _admin_load(self, request: Request) -> Response:
        """The router's load (`routing.load_report.LoadReport`, from its `LoadLedger`): what the switcher reads."""
        if (denied := self._admin_denied(request)) is not None:
            return denied
        report = self.router.load_ledger.report(st.view for st in self.router.replicas)
        return Response(report.model_dump_json(), media_type="application/json")

    async def _admin_picture(self, request: Request) -> Response:
        """The picture (prefix indexes, KV-event mirrors and positions) and the applied membership, msgpack: what a
        router started with `picture_peers` restores."""
        if (denied := self._admin_denied(request)) is not None:
            return denied
        doc = capture_picture(self.router)
        doc["shared_from"] = share_position(self.router)
        m = self.router.replicas.membership
        doc["membership"] = m.model_dump(mode="json") if m is not None else None
        return Response(msgpack.packb(doc, use_bin_type=True), media_type=PICTURE_MEDIA_TYPE)

    async def _admin_picture_delta(self, request: Request) -> Response:
        """The prefix-index chains this router inserted and the sessions it routed since the numbers in the body
        (msgpack `{"since": {replica_id: number}, "sessions": number}`), msgpack: what a peer's `PictureSharer`
        takes every period."""
        if (denied := self._admin_denied(request)) is not None:
            return denied
        try:
            since, sessions = parse_delta_request(await request.body())
        except (ValueError, TypeError, KeyError, msgpack.exceptions.ExtraData) as e:
            return _error(400, f"invalid picture delta request: {e}", "invalid_request_error")
        doc = delta_document(self.router, since, sessions)
        return Response(msgpack.packb(doc, use_bin_type=True), media_type=PICTURE_MEDIA_TYPE)

    async def _admin_drain(self, request: Request) -> Response:
        if (denied := self._admin_denied(request)) is not None:
            return denied
        rid = request.path_params["replica_id"]
        try:
            st = self.router.replicas.set_draining(rid, request.url.path.endswith("/drain"))
        except KeyError:
            return _error(404, f"unknown replica '{rid}'", "not_found_error")
        return JSONResponse({"id": rid, "draining": st.view.draining, "active_requests": st.view.active_requests})
