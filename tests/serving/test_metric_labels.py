"""Request metrics are labelled with versions that exist: clients naming made-up versions,
labels or models cannot grow ``/metrics``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving.config import GatewayConfig
from serving.metrics import GatewayMetrics
from tests.support.gateways import GatewayThread
from tests.support.http import http
from tests.support.serving_models import ServingModel, sample_inputs

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, serving_model: ServingModel
) -> Iterator[GatewayThread]:
    root: Path = tmp_path_factory.mktemp("labels") / "models"
    serving_model.publish(root, 1)
    with GatewayThread(root, GatewayConfig(poll_interval_s=0.2)) as thread:
        yield thread


def series(server: GatewayThread) -> list[str]:
    status, text = http(server, "GET", "/metrics")
    assert status == 200
    return [line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")]


def bogus_requests(server: GatewayThread, start: int, count: int) -> None:
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for version in range(start, start + count):
            assert http(server, "POST", f"/v1/models/digits/versions/{version}:predict",
                        {"instances": [1]})[0] == 404  # fmt: skip
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "digits"
            request.model_spec.version.value = version
            with pytest.raises(grpc.RpcError) as error:
                stub.Predict(request, timeout=30)
            assert error.value.code() == grpc.StatusCode.NOT_FOUND
            request.model_spec.ClearField("version")
            request.model_spec.version_label = f"label-{version}"
            with pytest.raises(grpc.RpcError):
                stub.Predict(request, timeout=30)
            request.model_spec.name = f"model-{version}"
            with pytest.raises(grpc.RpcError):
                stub.Predict(request, timeout=30)


def test_bogus_versions_labels_and_models_leave_the_series_count_unchanged(server) -> None:
    bogus_requests(server, 1000, 2)  # the "unknown" series are made once
    before = series(server)
    bogus_requests(server, 2000, 100)
    after = series(server)
    assert len(after) == len(before), sorted(set(after) - set(before))[:5]
    assert not any('version="2' in line for line in after)
    unknown = [line for line in after if 'version="unknown"' in line and "_total" in line]
    assert unknown, "requests for versions that do not exist are still counted"


def test_an_existing_version_keeps_its_own_label(server) -> None:
    inputs = sample_inputs(1)
    body = {"instances": [{name: array[0].tolist() for name, array in inputs.items()}]}
    assert http(server, "POST", "/v1/models/digits/versions/1:predict", body)[0] == 200
    assert any(
        'code="OK"' in line and 'route="explicit"' in line and 'version="1"' in line
        for line in series(server)
    )


def test_version_label_is_unknown_for_versions_without_series() -> None:
    metrics = GatewayMetrics()
    metrics.create_version_series("digits", 3)
    assert metrics.version_label("digits", 3) == "3"
    assert metrics.version_label("digits", "3") == "3"
    assert metrics.version_label("digits", 4) == "unknown"
    assert metrics.version_label("other", 3) == "unknown"
    assert metrics.version_label("digits", None) == "unknown"
