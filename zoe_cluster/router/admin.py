"""The router's non-proxy endpoints (a Starlette app): /health, /v1/models, /metrics and the admin API.

The admin API (membership push, drain) needs the admin bearer key and is disabled (403) without one; see
`zoe_cluster.router.membership` for the contract.
"""

from __future__ import annotations

import hmac
import json
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zoe_cluster.router.errors import error_body
from zoe_cluster.router.membership import Membership
from zoe_cluster.router.replicas import StaleMembership

if TYPE_CHECKING:
    from zoe_cluster.router.app import Router


class AuxRoutes:
    """Endpoints other than the proxied /v1 POSTs, bound to one router."""

    def __init__(self, router: "Router") -> None:
        self.router = router
        self.app = Starlette(routes=self._routes())

    def _routes(self) -> list[Route]:
        return [
            Route("/health", self._health, methods=["GET"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/metrics", self._metrics, methods=["GET"]),
            Route("/admin/membership", self._admin_membership, methods=["GET", "PUT"]),
            Route("/admin/replicas/{replica_id:path}/drain", self._admin_drain, methods=["POST"]),
            Route("/admin/replicas/{replica_id:path}/undrain", self._admin_drain, methods=["POST"]),
        ]

    async def _health(self, request: Request) -> Response:
        now = self.router.clock()
        routable = sum(1 for st in self.router.replicas if st.routable(now))
        return JSONResponse({"status": "ok", "replicas": len(self.router.replicas.by_id), "routable": routable,
                             "membership_version": self.router.replicas.version})

    async def _models(self, request: Request) -> Response:
        if self.router._api_keys:
            auth = request.headers.get("authorization", "")
            if not auth.startswith("Bearer ") or auth[7:].strip().encode() not in self.router._api_keys:
                return JSONResponse(json.loads(error_body("missing or invalid API key", "authentication_error", 401)),
                                    status_code=401)
        data = [{"id": m, "object": "model", "owned_by": "zoe"} for m in sorted(self.router.served_models())]
        return JSONResponse({"object": "list", "data": data})

    async def _metrics(self, request: Request) -> Response:
        return Response(generate_latest(self.router.registry), media_type=CONTENT_TYPE_LATEST)

    def _admin_denied(self, request: Request) -> Response | None:
        if self.router._admin_auth is None:
            return JSONResponse({"error": {"message": "the admin API is disabled: start the router with an admin key",
                                           "type": "permission_error", "code": 403}}, status_code=403)
        if not hmac.compare_digest(request.headers.get("authorization", "").encode(), self.router._admin_auth):
            return JSONResponse({"error": {"message": "missing or invalid admin key", "type": "authentication_error",
                                           "code": 401}}, status_code=401)
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
            return JSONResponse(out)
        raw = await request.body()
        try:
            m = Membership.model_validate_json(raw)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in e.errors())
            return JSONResponse({"error": {"message": f"invalid membership: {problems}", "type": "invalid_request_error",
                                           "code": 400}}, status_code=400)
        try:
            changes = self.router.apply_membership(m)
        except StaleMembership as e:
            return JSONResponse({"error": {"message": str(e), "type": "conflict", "code": 409}}, status_code=409)
        self.router.health.kick()
        return JSONResponse({"version": m.version, "replicas": len(m.replicas), **changes})

    async def _admin_drain(self, request: Request) -> Response:
        if (denied := self._admin_denied(request)) is not None:
            return denied
        rid = request.path_params["replica_id"]
        try:
            st = self.router.replicas.set_draining(rid, request.url.path.endswith("/drain"))
        except KeyError:
            return JSONResponse({"error": {"message": f"unknown replica '{rid}'", "type": "not_found_error",
                                           "code": 404}}, status_code=404)
        return JSONResponse({"id": rid, "draining": st.view.draining, "active_requests": st.view.active_requests})
