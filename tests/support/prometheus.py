"""A real Prometheus on a free loopback port, and where the tests find its binaries.

The rollout, provider and deploy-asset tests run Debian's real ``prometheus`` package.
Without it they skip with one reason (``MISSING``), which the suite's closing summary
counts and explains. ``PrometheusProcess`` runs ``prometheus`` scraping the given targets
every second; every wait polls against a deadline and fails with Prometheus' log
instead of hanging.

    with FakeGateway() as gateway, PrometheusProcess([gateway.target]) as prometheus:
        gateway.record("m", 1, "stable", 10)
        prometheus.wait_until('sum(slipway_gateway_requests_total) == 10')

``stop()`` then ``start()`` again keeps the port and the data directory, which is how a
test simulates a Prometheus outage.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

import pytest

from ops.measurement import MetricsUnavailable
from ops.prometheus import PrometheusClient, Sample
from tests.support.ports import free_port
from tests.support.waiting import wait_until

MISSING = "Prometheus is not installed"
INSTALL_HINT = "`make prometheus` (Debian's package 'prometheus')"

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
WAIT_TIMEOUT_S = 20.0


def binary(name: str) -> str:
    """The path of ``prometheus`` or ``promtool``; skips the calling test when absent."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{MISSING}: no {name} on PATH; install with {INSTALL_HINT}")
    return path


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
                    binary("prometheus"),
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={self.directory / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until(
                self._ready_or_dead, f"Prometheus on port {self.port} to be ready", START_TIMEOUT_S
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
        return wait_until(
            lambda: self._query_or_nothing(promql),
            f"Prometheus query {promql!r} to return data",
            timeout,
        )

    def _query_or_nothing(self, promql: str) -> list[Sample]:
        """The query's result, empty while Prometheus cannot answer (starting, restarting)."""
        try:
            return self.client.query(promql)
        except MetricsUnavailable:
            return []

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
