"""The routing source's HTTP API (``slipway routing serve``).

Routes (JSON, ``Authorization: Bearer <admin token>`` on all but ``/healthz``):

======  ========================  ===========================================================
GET     /v1/routing               the table; ``?after=N&wait=S`` waits up to S seconds for a
                                  revision other than N (a watch); ``replica=`` and ``url=``
                                  name the watching replica
GET     /v1/routing/{model}       ``{"revision", "routing"}``, revision also as the ETag
PUT     /v1/routing/{model}       set one model's routing; ``If-Match: "<revision>"`` makes
                                  it a compare-and-swap (412 with the current revision if the
                                  model changed since; ``"0"``: only if it has no entry)
DELETE  /v1/routing/{model}       drop the model's entry (same ``If-Match``)
GET     /v1/replicas              the live replicas and the revision each has applied
GET     /healthz, /readyz         200 while the process runs
======  ========================  ===========================================================

A watch is a long poll, as Kubernetes' watch and Consul's blocking queries are: one
request per change, no message broker, and a replica that reconnects names the revision it
has, so it never misses a change made while it was away.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path

from aiohttp import web

from serving.admin_http import AdminAuth, Handler, read_body
from serving.errors import InvalidArgument, ServingError
from serving.routing import ModelRouting, RoutingConfig
from serving.routing_source import RoutingSource
from serving.routing_table import RevisionConflict, RoutingTable

logger = logging.getLogger(__name__)

MAX_WAIT_S = 60.0
SHUTDOWN_TIMEOUT_S = 5.0


@web.middleware
async def _errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every refusal is ``{"error": …}`` with its status; a conflict also says the revision."""
    try:
        return await handler(request)
    except RevisionConflict as exc:
        return web.json_response({"error": str(exc), "revision": exc.current}, status=412)
    except ServingError as exc:
        return web.json_response({"error": exc.message}, status=exc.http_status)


class RoutingService:
    """Binds ``RoutingSource`` to HTTP routes behind the admin token."""

    def __init__(self, source: RoutingSource, auth: AdminAuth) -> None:
        self.source = source
        self._auth = auth

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_errors_as_json])
        # Ready as soon as it answers: the table is loaded before the port opens.
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.healthz)
        for method, path, handler in [
            ("GET", "/v1/routing", self.watch),
            ("GET", "/v1/routing/{model}", self.get_model),
            ("PUT", "/v1/routing/{model}", self.put_model),
            ("DELETE", "/v1/routing/{model}", self.delete_model),
            ("GET", "/v1/replicas", self.replicas),
        ]:
            app.router.add_route(method, path, self._auth.guarded(handler))
        return app

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"revision": self.source.table.revision})

    async def watch(self, request: web.Request) -> web.Response:
        # No ``after``: answer at once (-1 is never a revision).
        after = int(_number(request, "after", int, -1))
        wait = min(_number(request, "wait", float, 0.0), MAX_WAIT_S)
        table = await self.source.watch(
            after,
            wait,
            replica=request.query.get("replica") or None,
            url=request.query.get("url") or None,
        )
        return web.json_response(table.to_json())

    async def get_model(self, request: web.Request) -> web.Response:
        return _entry(self.source.table, request.match_info["model"])

    async def put_model(self, request: web.Request) -> web.Response:
        routing = await read_body(request, ModelRouting)
        return await self._set(request, routing)

    async def delete_model(self, request: web.Request) -> web.Response:
        return await self._set(request, None)

    async def replicas(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        return web.json_response(
            {
                "revision": self.source.table.revision,
                "replicas": [record.to_json(now) for record in self.source.replicas()],
            }
        )

    async def _set(self, request: web.Request, routing: ModelRouting | None) -> web.Response:
        model = request.match_info["model"]
        table = await self.source.set_model(model, routing, if_match=_if_match(request))
        return _entry(table, model)


def _entry(table: RoutingTable, model: str) -> web.Response:
    """One model's routing at ``table`` (the table a write produced, not a later one)."""
    entry = table.models.get(model)
    revision = table.model_revision(model)
    body = {
        "revision": revision,
        "table_revision": table.revision,
        "routing": (entry.routing if entry else ModelRouting()).model_dump(
            mode="json", exclude_none=True
        ),
    }
    return web.json_response(body, headers={"ETag": f'"{revision}"'})


def _number(
    request: web.Request, name: str, kind: type[int] | type[float], default: float
) -> float:
    """A non-negative query parameter, or ``default`` when it is absent."""
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = -1
    if not 0 <= value < float("inf"):
        raise InvalidArgument(f"query parameter {name}: expected a number >= 0, got {raw!r}")
    return value


def _if_match(request: web.Request) -> int | None:
    raw = request.headers.get("If-Match")
    if raw is None:
        return None
    try:
        revision = int(raw.strip().removeprefix("W/").strip('"'))
    except ValueError:
        revision = -1
    if revision < 0:
        raise InvalidArgument(f'If-Match: expected a model revision such as "3", got {raw!r}')
    return revision


async def serve_source(
    path: Path, seed: RoutingConfig | None, token: str, host: str, port: int
) -> int:
    """Run the source until SIGTERM or SIGINT, then answer the watchers and stop."""
    source = await asyncio.to_thread(RoutingSource.open, path, seed)
    runner = web.AppRunner(
        RoutingService(source, AdminAuth(token)).app(), shutdown_timeout=SHUTDOWN_TIMEOUT_S
    )
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    logger.info(
        "routing source on %s:%d, table %s at revision %d", host, port, path, source.table.revision
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    logger.info("stopping the routing source")
    await source.close()
    await runner.cleanup()
    return 0
