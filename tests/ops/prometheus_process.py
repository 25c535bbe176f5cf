"""A real Prometheus and fake gateway metrics endpoints, on free loopback ports, for tests.

``FakeGateway`` serves a ``GatewayMetrics`` registry on ``/metrics`` exactly as a gateway
does, and lets a test count requests, latencies, failovers, shadow comparisons and label
feedback without starting TensorFlow. ``PrometheusProcess`` runs ``/usr/bin/prometheus`` scraping
such targets every second. Every wait polls against a deadline and fails with
Prometheus' log instead of hanging.

    with FakeGateway() as gateway, PrometheusProcess([gateway.target]) as prometheus:
        gateway.record("m", 1, "stable", 10)
        prometheus.wait_until('sum(slipway_gateway_requests_total) == 10')

``stop()`` then ``start()`` again keeps the port and the data directory, which is how a
test simulates a Prometheus outage.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.registry import Collector

from ops.measurement import MetricsUnavailable
from ops.prometheus import PrometheusClient, Sample
from serving.metrics import GatewayMetrics
from tests import prometheus_binaries

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
WAIT_TIMEOUT_S = 20.0
POLL_S = 0.05


def free_port() -> int:
    """A loopback port nothing listens on right now.

    (tests/serving/gateway_process.py has the same probe, but importing it starts
    TensorFlow, which these tests do not need.)
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def poll(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Return once ``condition()`` holds; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(POLL_S)


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


class PrometheusProcess:
    """``prometheus`` in a child process, scraping ``targets`` (``host:port``) on loopback."""

    def __init__(
        self,
        targets: list[str],
        *,
        scrape_interval: str = "1s",
        data_dir: Path | None = None,
    ) -> None:
        self.targets = list(targets)
        self.port = free_port()
        self._owns_dir = data_dir is None
        self.directory = (
            Path(tempfile.mkdtemp(prefix="prometheus-")) if data_dir is None else data_dir
        )
        self.config_path = self.directory / "prometheus.yml"
        self.log_path = self.directory / "prometheus.log"
        self.config_path.write_text(_config(self.targets, scrape_interval), encoding="utf-8")
        self.client = PrometheusClient(self.url, timeout=5.0)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> PrometheusProcess:
        """Start (or start again, same port and data) and wait until ``/-/ready`` answers."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    prometheus_binaries.binary("prometheus"),
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={self.directory / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            poll(
                self._ready_or_dead, START_TIMEOUT_S, f"Prometheus on port {self.port} to be ready"
            )
        except AssertionError:
            self.stop()
            raise AssertionError(f"Prometheus did not become ready:\n{self.log()}") from None
        if self.process.poll() is not None:
            raise AssertionError(f"Prometheus exited with {self.process.returncode}:\n{self.log()}")
        return self

    def _ready_or_dead(self) -> bool:
        return self.process is None or self.process.poll() is not None or self.client.ready()

    def stop(self) -> None:
        """Terminate, wait, kill if it will not go: the data directory stays for a restart."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT_S)
        self.process = None

    def close(self) -> None:
        """Stop and delete the data directory when this object created it."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def log(self) -> str:
        return (
            self.log_path.read_text(encoding="utf-8", errors="replace")
            if self.log_path.exists()
            else ""
        )

    def query(self, promql: str, *, at: float | None = None) -> list[Sample]:
        return self.client.query(promql, at=at)

    def wait_until(self, promql: str, timeout: float = WAIT_TIMEOUT_S) -> list[Sample]:
        """Poll ``promql`` until it returns a non-empty result (a filter such as ``== 10``
        returns nothing until it holds), and return that result."""
        result: list[Sample] = []

        def holds() -> bool:
            nonlocal result
            try:
                result = self.client.query(promql)
            except MetricsUnavailable:
                return False
            return bool(result)

        poll(holds, timeout, f"Prometheus query {promql!r} to return data")
        return result

    def wait_for_targets(self, timeout: float = WAIT_TIMEOUT_S) -> None:
        """Wait until every target has been scraped successfully at least once."""
        self.wait_until(f"sum(up) == {len(self.targets)}", timeout)

    def __enter__(self) -> PrometheusProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _config(targets: list[str], scrape_interval: str) -> str:
    listed = ", ".join(f'"{target}"' for target in targets)
    return (
        "global:\n"
        f"  scrape_interval: {scrape_interval}\n"
        f"  scrape_timeout: {scrape_interval}\n"
        f"  evaluation_interval: {scrape_interval}\n"
        "scrape_configs:\n"
        "  - job_name: slipway-gateway\n"
        "    static_configs:\n"
        f"      - targets: [{listed}]\n"
    )
