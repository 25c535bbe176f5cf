"""The admin API: routing, batching and reload, behind a bearer token.

Routes (JSON bodies, ``Authorization: Bearer <token>``):

=======  ===========================  ==========================================================
GET      /admin/routing               the routing config in force
GET      /admin/routing/status        where it comes from: the routing source, the revision
                                      applied and whether the source answers (or the file)
PUT      /admin/routing               replace it (sent to the routing source, or written to
                                      the routing file, so every replica follows; only the
                                      models that differ are written, each as a
                                      compare-and-swap, so no concurrent change is lost)
GET      /admin/routing/{model}       one model's routing
PUT      /admin/routing/{model}       replace one model's routing (labels, canary_weight, …)
DELETE   /admin/routing/{model}       drop it: the model routes to its highest version
GET      /admin/batching/{model}      the model's batching parameters
PUT      /admin/batching/{model}      change them at run time (not persisted: put them in
                                      gateway.yaml to keep them across restarts)
POST     /admin/reload                rescan the model root and re-read the routing file
=======  ===========================  ==========================================================

With no token configured the API does not exist (404 over REST, PERMISSION_DENIED for
gRPC's ``HandleReloadConfigRequest``). A missing token is 401, a wrong one 403. Tokens
are compared in constant time so response timing does not leak how much of a guess was
right (``serving.admin_http``).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from serving.admin_http import AdminAuth, read_body
from serving.batching import BatchingConfig
from serving.gateway import Gateway
from serving.routing import ModelRouting, RoutingConfig

__all__ = ["AdminApi", "AdminAuth"]


class AdminApi:
    """The admin routes of the REST server."""

    def __init__(self, gateway: Gateway, auth: AdminAuth) -> None:
        self._gateway = gateway
        self._auth = auth

    def add_routes(self, app: web.Application) -> None:
        """Register the routes, behind the token check; none at all when admin is off."""
        if not self._auth.enabled:
            return
        routes = [
            ("GET", "/admin/routing", self.get_routing),
            ("GET", "/admin/routing/status", self.get_routing_status),
            ("PUT", "/admin/routing", self.put_routing),
            ("GET", "/admin/routing/{model}", self.get_model_routing),
            ("PUT", "/admin/routing/{model}", self.put_model_routing),
            ("DELETE", "/admin/routing/{model}", self.delete_model_routing),
            ("GET", "/admin/batching/{model}", self.get_batching),
            ("PUT", "/admin/batching/{model}", self.put_batching),
            ("POST", "/admin/reload", self.reload),
        ]
        for method, path, handler in routes:
            app.router.add_route(method, path, self._auth.guarded(handler))

    def _routing_json(self) -> dict[str, Any]:
        return self._gateway.routing_config().model_dump(mode="json", exclude_none=True)

    async def get_routing(self, request: web.Request) -> web.Response:
        return web.json_response(self._routing_json())

    async def get_routing_status(self, request: web.Request) -> web.Response:
        return web.json_response(self._gateway.routing.status())

    async def put_routing(self, request: web.Request) -> web.Response:
        config = await read_body(request, RoutingConfig)
        await self._gateway.set_routing(config)
        return web.json_response(self._routing_json())

    async def get_model_routing(self, request: web.Request) -> web.Response:
        routing = self._gateway.routing_config().for_model(request.match_info["model"])
        return web.json_response(routing.model_dump(mode="json", exclude_none=True))

    async def put_model_routing(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        routing = await read_body(request, ModelRouting)
        await self._gateway.set_model_routing(model, routing)
        return web.json_response(routing.model_dump(mode="json", exclude_none=True))

    async def delete_model_routing(self, request: web.Request) -> web.Response:
        await self._gateway.set_model_routing(request.match_info["model"], None)
        return web.json_response(self._routing_json())

    async def get_batching(self, request: web.Request) -> web.Response:
        config = self._gateway.batching_config(request.match_info["model"])
        return web.json_response(config.model_dump(mode="json"))

    async def put_batching(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        config = await read_body(request, BatchingConfig)
        self._gateway.set_batching_config(model, config)
        return web.json_response(config.model_dump(mode="json"))

    async def reload(self, request: web.Request) -> web.Response:
        await self._gateway.reload()
        return web.json_response({"models": self._gateway.health.models()})
