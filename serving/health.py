"""Liveness, readiness and per-model health, published to both probes' audiences.

Kubernetes asks REST ``/healthz`` and ``/readyz``; gRPC load balancers ask the standard
``grpc.health.v1.Health`` service, where the service name is a model name (SERVING while
at least one of its versions is AVAILABLE) and ``""`` is the whole server. Both read the
same state so they never disagree. A gateway with no model able to answer (an empty model
root, every version failed) is not ready, unless configured to be (``ready_without_models``
in gateway.yaml). Draining is one-way: once SIGTERM arrives nothing
reports SERVING again, so load balancers stop sending traffic before the listeners close.
"""

from __future__ import annotations

from collections.abc import Mapping

from grpc_health.v1 import health_pb2
from grpc_health.v1.health import OVERALL_HEALTH
from grpc_health.v1.health import aio as health_aio

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Health:
    """Readiness of the gateway and of each model, and the gRPC health servicer."""

    def __init__(self, *, require_model: bool = True) -> None:
        self.servicer = health_aio.HealthServicer()
        # Ready only while some model can answer; off for a gateway that may rightly
        # serve none (one fronting remote model servers that are not up yet).
        self.require_model = require_model
        self._models: dict[str, bool] = {}
        self._loaded = False
        self._draining = False
        self._overall: bool | None = None

    @property
    def ready(self) -> bool:
        """The first repository sync finished, some model has a version AVAILABLE (unless
        ``require_model`` is off) and the gateway is not shutting down."""
        return self._loaded and not self._draining and self._has_model()

    def _has_model(self) -> bool:
        return not self.require_model or any(self._models.values())

    @property
    def draining(self) -> bool:
        return self._draining

    def models(self) -> dict[str, bool]:
        """Model name -> serving (at least one version AVAILABLE)."""
        return dict(self._models)

    async def start(self) -> None:
        """Report NOT_SERVING overall until the models have been loaded once."""
        await self.servicer.set(OVERALL_HEALTH, NOT_SERVING)

    async def update(self, serving_by_model: Mapping[str, bool], *, loaded: bool = True) -> None:
        """Publish which models can answer; ``loaded`` marks the first sync as done."""
        # A model removed from disk stays known, as NOT_SERVING, so watchers see it go.
        current = {**dict.fromkeys(self._models, False), **serving_by_model}
        for model, serving in current.items():
            if self._models.get(model) != serving:
                await self.servicer.set(model, SERVING if serving else NOT_SERVING)
        self._models = current
        if loaded:
            self._loaded = True
        overall = self._loaded and self._has_model()
        if overall != self._overall and not self._draining:
            self._overall = overall
            await self.servicer.set(OVERALL_HEALTH, SERVING if overall else NOT_SERVING)

    async def drain(self) -> None:
        """Stop reporting SERVING anywhere, for good."""
        self._draining = True
        await self.servicer.enter_graceful_shutdown()
