"""``slipway serve``: graceful drain on SIGTERM, as a real process, and configuration errors
named by file and line."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from tensorflow_serving.apis import prediction_service_pb2_grpc

from serving.process import GatewayProcess
from slipway.cli import main
from tests.support.grpc_requests import predict_request
from tests.support.serving_models import ServingModel
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

# Requests wait this long for their batch to fill: slow requests without a slow model.
# Everything between the first request and the refusals after SIGTERM must happen while
# they wait, so this is sized for a loaded machine, not for a quiet one.
BATCH_WAIT_S = 12.0
IN_FLIGHT = 4


def in_flight(gateway: GatewayProcess) -> float:
    with urllib.request.urlopen(gateway.rest_url + "/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith('slipway_gateway_in_flight{model="digits",version="1"}'):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.process
def test_sigterm_drains_in_flight_requests_refuses_new_ones_and_exits_0(
    tmp_path: Path, serving_model: ServingModel
) -> None:
    root = tmp_path / "models"
    serving_model.publish(root, 1)
    config = tmp_path / "gateway.yaml"
    config.write_text(
        json.dumps(
            {
                "grace_period_s": 20,
                "batching": {"max_batch_size": 64, "batch_timeout_micros": int(BATCH_WAIT_S * 1e6)},
            }
        )
    )
    gateway = GatewayProcess(root, config=config).start()
    try:
        with grpc.insecure_channel(gateway.grpc_target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            slow = [stub.Predict.future(predict_request(), timeout=60) for _ in range(IN_FLIGHT)]
            wait_until(lambda: in_flight(gateway) == IN_FLIGHT, "requests in flight")
            gateway.terminate()
            wait_until(lambda: gateway.http_status("/readyz") == 503, "readiness to turn false")

            with pytest.raises(grpc.RpcError) as refused:
                stub.Predict(predict_request(), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in refused.value.details()
            body = json.dumps({"instances": [{"image": [[[0.0]] * 8] * 8, "extra": [1, 2, 3]}]})
            request = urllib.request.Request(
                gateway.rest_url + "/v1/models/digits:predict", data=body.encode()
            )
            with pytest.raises(urllib.error.HTTPError) as rest_refused:
                urllib.request.urlopen(request, timeout=10)
            assert rest_refused.value.code == 503

            for future in slow:
                response = future.result(timeout=60)
                assert response.model_spec.version.value == 1
                assert set(response.outputs) == {"label", "value"}
        assert gateway.wait() == 0
    finally:
        gateway.kill()
    assert "shutting down" in gateway.output()


def test_a_config_error_names_the_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "gateway.yaml").write_text("strict: false\nbatching:\n  max_batch_size: lots\n")
    monkeypatch.chdir(tmp_path)
    assert main(["serve", "--model-root", "models", "--config", "gateway.yaml"]) == 2
    message = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert "error: gateway.yaml:3: batching.max_batch_size:" in message
    assert "'lots'" in message
