"""``slipway serve`` as a real process: graceful drain on SIGTERM and command-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving.tensors import numpy_to_tensor_proto
from tests.serving import model_factory
from tests.serving.gateway_process import GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# Requests wait this long for their batch to fill: slow requests without a slow model.
# Everything between the first request and the refusals after SIGTERM must happen while
# they wait, so this is sized for a loaded machine, not for a quiet one.
BATCH_WAIT_S = 12.0
IN_FLIGHT = 4


def predict_request() -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "digits"
    for name, array in model_factory.sample_inputs(1).items():
        request.inputs[name].CopyFrom(numpy_to_tensor_proto(array))
    return request


def in_flight(gateway: GatewayProcess) -> float:
    with urllib.request.urlopen(gateway.rest_url + "/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith('slipway_gateway_in_flight{model="digits",version="1"}'):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_until(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)  # observing another process: poll


def test_sigterm_drains_in_flight_requests_refuses_new_ones_and_exits_0(tmp_path: Path) -> None:
    root = tmp_path / "models"
    model_factory.publish(root, 1)
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


def test_a_config_error_names_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "gateway.yaml").write_text("strict: false\nbatching:\n  max_batch_size: lots\n")
    result = subprocess.run(
        [sys.executable, "-m", "slipway", "serve", "--model-root", "models",
         "--config", "gateway.yaml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    message = " ".join(result.stderr.split())  # the console wraps long lines
    assert "error: gateway.yaml:3: batching.max_batch_size:" in message
    assert "'lots'" in message
