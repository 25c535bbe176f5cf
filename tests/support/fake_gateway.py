"""A gateway's ``/metrics`` endpoint fed by the test instead of by traffic.

``FakeGateway`` serves a ``GatewayMetrics`` registry on ``/metrics`` exactly as a gateway
does, and lets a test count requests, latencies, failovers, shadow comparisons and label
feedback without starting TensorFlow, for the metrics providers and a real Prometheus to
read:

    with FakeGateway() as gateway:
        gateway.record("m", 1, "stable", 10)
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.registry import Collector

from serving.metrics import GatewayMetrics

STOP_TIMEOUT_S = 10.0


class _CurrentMetrics(Collector):
    """Collects whichever ``GatewayMetrics`` the fake gateway holds now, so that replacing
    it behaves like a gateway restart (every counter back to zero) on the same port."""

    def __init__(self, gateway: FakeGateway) -> None:
        self._gateway = gateway

    def collect(self) -> Iterator:
        return self._gateway.metrics.registry.collect()


class FakeGateway:
    """A gateway's ``/metrics`` endpoint, fed by the test instead of by traffic."""

    def __init__(self) -> None:
        self.metrics = GatewayMetrics()
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_CurrentMetrics(self))
        self._server = None
        self._thread = None

    def start(self) -> FakeGateway:
        self._server, self._thread = start_http_server(0, addr="127.0.0.1", registry=self._registry)
        return self

    @property
    def port(self) -> int:
        assert self._server is not None, "FakeGateway is not started"
        return self._server.server_port

    @property
    def target(self) -> str:
        """``host:port``, as a Prometheus scrape config lists it."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.target}"

    def record(
        self,
        model: str,
        version: int,
        route: str,
        count: int,
        *,
        code: str = "OK",
        seconds: float = 0.003,
        api: str = "rest",
    ) -> None:
        """``count`` answered requests of one version and route, all with one code and latency."""
        for _ in range(count):
            self.metrics.observe_request(model, version, route, code, api, seconds)

    def declare(
        self, model: str, version: int, route: str, codes: tuple[str, ...] = ("OK",)
    ) -> None:
        """Create a version's request series at zero, as Prometheus must see them before the
        first request for ``increase()`` to count that request exactly."""
        for code in codes:
            self.metrics.requests.labels(model, str(version), route, code, "rest")
        self.metrics.request_seconds.labels(model, str(version), route)

    def feedback_for(
        self, model: str, version: int, route: str, *, correct: int = 0, incorrect: int = 0
    ) -> None:
        """Labels received for a version's predictions (the series exist from then on)."""
        for outcome, count in (("correct", correct), ("incorrect", incorrect)):
            self.metrics.feedback.labels(model, str(version), route, outcome).inc(count)

    def restart_counters(self) -> None:
        """Drop every series, like a gateway process that restarted."""
        self.metrics = GatewayMetrics()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=STOP_TIMEOUT_S)
            self._server = self._thread = None

    def __enter__(self) -> FakeGateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
