"""The admin API: routing, batching and reload, behind a bearer token.

Routes (JSON bodies, ``Authorization: Bearer <token>``):

=======  ===========================  ==========================================================
GET      /admin/routing               the routing config in force
PUT      /admin/routing               replace it (written to the routing file when one is set,
                                      so every replica reading that file follows)
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
right.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic
from aiohttp import web

from serving.batching import BatchingConfig
from serving.errors import InvalidArgument, PermissionDenied, Unauthenticated
from serving.gateway import Gateway
from serving.rest_api import read_json
from serving.routing import ModelRouting, RoutingConfig

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AdminAuth:
    """Checks ``Authorization`` values against the configured token (None: admin off)."""

    def __init__(self, token: str | None) -> None:
        self._token = None if token is None else token.encode("utf-8")

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def check(self, authorization: str | None) -> None:
        """Return if ``authorization`` carries the token; raise the right error if not."""
        if self._token is None:
            raise PermissionDenied("the admin API is disabled: no admin token is configured")
        if not authorization:
            raise Unauthenticated("admin calls need an 'authorization: Bearer <token>' header")
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            raise Unauthenticated("admin calls need an 'authorization: Bearer <token>' header")
        if not hmac.compare_digest(credentials.strip().encode("utf-8"), self._token):
            raise PermissionDenied("the admin token is not valid")


def _parse(model_type: type[pydantic.BaseModel], data: Any) -> Any:
    try:
        return model_type.model_validate(data)
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or '<body>'}: "
            f"{error['msg'].removeprefix('Value error, ')}"
            for error in exc.errors()
        )
        raise InvalidArgument(f"invalid {model_type.__name__}: {problems}") from None


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
            ("PUT", "/admin/routing", self.put_routing),
            ("GET", "/admin/routing/{model}", self.get_model_routing),
            ("PUT", "/admin/routing/{model}", self.put_model_routing),
            ("DELETE", "/admin/routing/{model}", self.delete_model_routing),
            ("GET", "/admin/batching/{model}", self.get_batching),
            ("PUT", "/admin/batching/{model}", self.put_batching),
            ("POST", "/admin/reload", self.reload),
        ]
        for method, path, handler in routes:
            app.router.add_route(method, path, self._authorized(handler))

    def _authorized(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            self._auth.check(request.headers.get("Authorization"))
            return await handler(request)

        return guarded

    def _routing_json(self) -> dict[str, Any]:
        return self._gateway.routing_config().model_dump(mode="json", exclude_none=True)

    async def get_routing(self, request: web.Request) -> web.Response:
        return web.json_response(self._routing_json())

    async def put_routing(self, request: web.Request) -> web.Response:
        config = _parse(RoutingConfig, await read_json(request))
        await self._gateway.set_routing(config)
        return web.json_response(self._routing_json())

    async def get_model_routing(self, request: web.Request) -> web.Response:
        routing = self._gateway.routing_config().for_model(request.match_info["model"])
        return web.json_response(routing.model_dump(mode="json", exclude_none=True))

    async def put_model_routing(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        routing = _parse(ModelRouting, await read_json(request))
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
        config = _parse(BatchingConfig, await read_json(request))
        self._gateway.set_batching_config(model, config)
        return web.json_response(config.model_dump(mode="json"))

    async def reload(self, request: web.Request) -> web.Response:
        await self._gateway.reload()
        return web.json_response({"models": self._gateway.health.models()})
