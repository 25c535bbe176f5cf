"""A gateway started on an empty model root serves on, says so naming the root, and is
not ready until a model can answer, unless ``ready_without_models`` says it may be."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from serving.config import GatewayConfig, load_config
from serving.server import GatewayServer
from tests.support.gateways import GatewayThread
from tests.support.serving_models import MODEL_NAME, ServingModel
from tests.support.waiting import wait_until

MODEL = MODEL_NAME


class Started(GatewayThread):
    """A gateway thread that does not wait for readiness (it may never come)."""

    def start(self, timeout: float = 30.0) -> Started:
        self._thread.start()
        self.run(self.server.start(), timeout)
        wait_until(lambda: self.gateway.repository.wait_ready(0), "the first load")
        return self

    def overall_health(self) -> int:
        with grpc.insecure_channel(self.grpc_target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status

    def readyz(self) -> int:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"{self.rest_url}/readyz", timeout=10) as answer:
                return answer.status
        except urllib.error.HTTPError as exc:
            return exc.code


def test_an_empty_root_warns_and_is_not_ready_until_a_model_is_published(
    root: Path, caplog: pytest.LogCaptureFixture, serving_model: ServingModel
) -> None:
    with caplog.at_level(logging.WARNING, logger="serving.gateway"):
        server = Started(root, GatewayConfig(poll_interval_s=0.2))
        with server:
            wait_until(lambda: "holds no models" in caplog.text, "the warning")
            assert str(root) in caplog.text
            for _ in range(2):  # a poll or two later, still nothing to serve
                server.gateway.repository.poll()
            assert not server.gateway.health.ready
            assert server.readyz() == 503
            assert server.overall_health() == health_pb2.HealthCheckResponse.NOT_SERVING

            serving_model.publish(root, 1)
            wait_until(lambda: server.gateway.health.ready, "readiness once a model loads")
            assert server.readyz() == 200
            assert server.overall_health() == health_pb2.HealthCheckResponse.SERVING


def test_ready_without_models_is_ready_on_an_empty_root(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config_file = tmp_path / "gateway.yaml"
    config_file.write_text("ready_without_models: true\npoll_interval_s: 0.2\n")
    config = load_config(config_file)
    assert config.ready_without_models is True
    with caplog.at_level(logging.WARNING, logger="serving.gateway"):
        server = Started(root, config)
        with server:
            wait_until(lambda: server.gateway.health.ready, "readiness")
            assert server.readyz() == 200
            assert server.overall_health() == health_pb2.HealthCheckResponse.SERVING
    assert "ready_without_models" in caplog.text


def test_a_root_whose_models_all_failed_is_not_ready(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    version = root / MODEL / "1"
    version.mkdir(parents=True)
    (version / "saved_model.pb").write_bytes(b"not a SavedModel")
    with caplog.at_level(logging.WARNING, logger="serving.gateway"):
        server = Started(root, GatewayConfig(poll_interval_s=0.2))
        with server:
            wait_until(lambda: f"no version of {MODEL} is available" in caplog.text, "warning")
            assert not server.gateway.health.ready


def test_the_gateway_server_still_refuses_a_root_that_is_not_a_directory(tmp_path: Path) -> None:
    from serving.server import StartupError

    server = GatewayServer(tmp_path / "missing", GatewayConfig(), grpc_port=0, rest_port=0)
    with pytest.raises(StartupError, match="not a directory"):
        asyncio.run(server.start())
