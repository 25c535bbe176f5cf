"""The REST API with a plain HTTP client: TF Serving's paths, formats and status codes,
the probes and metrics, and version changes under load."""

from __future__ import annotations

import base64
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from serving.config import GatewayConfig
from tests.support.gateways import GatewayThread
from tests.support.http import http
from tests.support.serving_models import CLASSES, ServingModel, sample_inputs
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

# A batch window no test outlives: requests to ``queued`` leave its batch only by their
# own deadline or by being refused, never because time ran out, however slow the machine.
NEVER_CUT_MICROS = 600_000_000


def write_text_model(directory: Path) -> None:
    """A string model: ``text`` [-1] -> ``length`` [-1] and ``echo_bytes`` (the input)."""

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def serve(self, text: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"length": tf.strings.length(text), "echo_bytes": text}

    module = Model()
    tf.saved_model.save(module, str(directory), signatures={"serving_default": module.serve})


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, serving_model: ServingModel) -> Path:
    root = tmp_path_factory.mktemp("rest") / "models"
    serving_model.publish(root, 1)
    serving_model.publish(root, 1, name="swap")
    serving_model.publish(root, 1, name="guarded")
    serving_model.publish(root, 1, name="queued")
    write_text_model(root / "text" / "1")
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[GatewayThread]:
    config = GatewayConfig.model_validate(
        {
            "poll_interval_s": 0.2,
            "batching": {"batch_timeout_micros": 1000},
            "models": {
                "queued": {
                    "batching": {
                        "max_batch_size": 4,
                        "max_enqueued_batches": 1,
                        "batch_timeout_micros": NEVER_CUT_MICROS,
                    }
                }
            },
        }
    )
    with GatewayThread(root, config) as thread:
        yield thread


def instance(inputs: dict[str, np.ndarray], row: int) -> dict[str, Any]:
    return {name: array[row].tolist() for name, array in inputs.items()}


# -- status and metadata ---------------------------------------------------------------


def test_model_status_paths(server) -> None:
    expected = {
        "model_version_status": [
            {
                "version": "1",
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
        ]
    }
    assert http(server, "GET", "/v1/models/digits") == (200, expected)
    assert http(server, "GET", "/v1/models/digits/versions/1") == (200, expected)
    status, body = http(server, "GET", "/v1/models/digits/versions/4")
    assert status == 404 and "version 4" in body["error"]
    status, body = http(server, "GET", "/v1/models/digits/labels/stable")
    assert status == 400 and "stable" in body["error"]
    assert http(server, "GET", "/v1/models/nope")[0] == 404


def test_metadata_path(server) -> None:
    status, body = http(server, "GET", "/v1/models/digits/versions/1/metadata")
    assert status == 200
    assert body["model_spec"] == {"name": "digits", "signature_name": "", "version": "1"}
    signature = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert signature["inputs"]["image"]["dtype"] == "DT_FLOAT"
    dims = [int(d["size"]) for d in signature["inputs"]["image"]["tensor_shape"]["dim"]]
    assert dims == [-1, 8, 8, 1]
    assert signature["method_name"] == "tensorflow/serving/predict"


# -- predict -----------------------------------------------------------------------------


def test_predict_row_format(server, serving_model: ServingModel) -> None:
    inputs = sample_inputs(3)
    status, body = http(
        server,
        "POST",
        "/v1/models/digits:predict",
        {"instances": [instance(inputs, i) for i in range(3)]},
    )
    assert status == 200
    expected = serving_model.keras_outputs(inputs)
    assert len(body["predictions"]) == 3
    for row, prediction in enumerate(body["predictions"]):
        np.testing.assert_allclose(prediction["label"], expected["label"][row], rtol=1e-5)
        np.testing.assert_allclose(prediction["value"], expected["value"][row], rtol=1e-5)


def test_predict_columnar_format_by_version(server, serving_model: ServingModel) -> None:
    inputs = sample_inputs(2)
    body = {
        "signature_name": "serving_default",
        "inputs": {k: v.tolist() for k, v in inputs.items()},
    }
    status, answer = http(server, "POST", "/v1/models/digits/versions/1:predict", body)
    assert status == 200
    expected = serving_model.keras_outputs(inputs)
    np.testing.assert_allclose(answer["outputs"]["label"], expected["label"], rtol=1e-5)


def test_binary_strings_travel_as_b64(server) -> None:
    payload = bytes(range(256))
    body = {"instances": [{"b64": base64.b64encode(payload).decode()}, "héllo"]}
    status, answer = http(server, "POST", "/v1/models/text:predict", body)
    assert status == 200
    first, second = answer["predictions"]
    assert first["length"] == 256
    assert base64.b64decode(first["echo_bytes"]["b64"]) == payload
    assert second["length"] == len("héllo".encode())
    assert base64.b64decode(second["echo_bytes"]["b64"]) == "héllo".encode()


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v1/models/nope:predict", {"instances": [1]}, 404, "'nope'"),
        ("/v1/models/digits/versions/7:predict", {"instances": [1]}, 404, "available versions: 1"),
        ("/v1/models/digits/versions/x:predict", {"instances": [1]}, 400, "integer"),
        ("/v1/models/digits/labels/gold:predict", {"instances": [1]}, 400, "gold"),
        ("/v1/models/digits:predict", {"signature_name": "nope", "instances": [1]}, 400, "nope"),
        ("/v1/models/digits:predict", {"instances": [1, 2]}, 400, "several inputs"),
        ("/v1/models/digits:predict", {"nothing": 1}, 400, "'inputs' or 'instances'"),
        (
            "/v1/models/digits:predict",
            {"inputs": {"image": [[[[0.5]] * 8] * 8], "extra": [[1.5, 2, 3]]}},
            400,
            "expected integers",
        ),
        (
            "/v1/models/digits:predict",
            {"inputs": {"image": [[[0.5]] * 8], "extra": [[1, 2, 3]]}},
            400,
            "expected float32 [-1, 8, 8, 1]",
        ),
        ("/v1/models/digits:explain", {}, 400, ":explain"),
        ("/v1/elsewhere", {}, 400, "Malformed request"),
        ("/elsewhere", {}, 404, "Not Found"),
    ],
)
def test_bad_requests_get_json_errors_with_the_right_status(
    server, path, body, status, message
) -> None:
    got_status, answer = http(server, "POST", path, body)
    assert got_status == status
    assert message in answer["error"]


def test_malformed_json_is_a_400(server) -> None:
    status, answer = http(server, "POST", "/v1/models/digits:predict", raw=b'{"instances": [1,')
    assert status == 400 and "not valid JSON" in answer["error"]
    status, answer = http(server, "GET", "/v1/models/digits:predict")
    assert status == 400 and "Malformed request" in answer["error"]


# -- classify / regress --------------------------------------------------------------------


def test_classify_and_regress(server, serving_model: ServingModel) -> None:
    inputs = sample_inputs(2, seed=5)
    examples = [
        {"image": inputs["image"][i].ravel().tolist(), "extra": inputs["extra"][i].tolist()}
        for i in range(2)
    ]
    expected = serving_model.keras_outputs(inputs)
    status, answer = http(server, "POST", "/v1/models/digits:classify", {"examples": examples})
    assert status == 200
    for row, scores in zip(answer["results"], expected["label"], strict=True):
        assert [label for label, _ in row] == CLASSES
        np.testing.assert_allclose([score for _, score in row], scores, rtol=1e-5)
    status, answer = http(server, "POST", "/v1/models/digits:regress", {"examples": examples})
    assert status == 200
    np.testing.assert_allclose(answer["results"], expected["value"][:, 0], rtol=1e-5)
    status, answer = http(
        server, "POST", "/v1/models/digits:regress", {"examples": [{"image": [0.0] * 64}]}
    )
    assert status == 400 and "missing feature 'extra'" in answer["error"]


# -- deadlines and queues -------------------------------------------------------------------


def test_timeout_header_is_honoured(server) -> None:
    inputs = {k: v.tolist() for k, v in sample_inputs(1).items()}
    status, answer = http(
        server,
        "POST",
        "/v1/models/queued:predict",
        {"inputs": inputs},
        {"X-Request-Timeout-Ms": "100"},
    )
    # Answered when its own deadline passed, while the batch it waited in was still open.
    assert status == 504 and "deadline exceeded after" in answer["error"]
    assert "waiting for the model" in answer["error"]
    status, answer = http(
        server,
        "POST",
        "/v1/models/queued:predict",
        {"inputs": inputs},
        {"X-Request-Timeout-Ms": "soon"},
    )
    assert status == 400 and "X-Request-Timeout-Ms" in answer["error"]


def test_more_rows_than_the_queue_ever_holds_is_a_400(server) -> None:
    inputs = {k: v.tolist() for k, v in sample_inputs(10).items()}
    status, answer = http(server, "POST", "/v1/models/queued:predict", {"inputs": inputs})
    assert status == 400 and "more than the batch queue ever holds" in answer["error"]


# -- probes and metrics ----------------------------------------------------------------------


def test_probes_and_metrics(server) -> None:
    assert http(server, "GET", "/healthz") == (200, {"status": "ok"})
    status, body = http(server, "GET", "/readyz")
    assert status == 200 and body["models"]["digits"] is True
    http(
        server,
        "POST",
        "/v1/models/digits:predict",
        {"instances": [instance(sample_inputs(1), 0)]},
    )
    status, text = http(server, "GET", "/metrics")
    assert status == 200
    assert (
        'slipway_gateway_requests_total{api="rest",code="OK",model="digits",route="stable",version="1"}'
        in text
    )
    assert 'slipway_gateway_model_loaded{model="digits",version="1"} 1.0' in text
    assert "slipway_gateway_request_seconds_bucket" in text


# -- versions changing under traffic ----------------------------------------------------------


def states(server: GatewayThread, model: str) -> dict[str, dict[str, Any]]:
    _, body = http(server, "GET", f"/v1/models/{model}")
    return {entry["version"]: entry for entry in body["model_version_status"]}


def test_hot_swap_under_concurrent_load_fails_no_request(
    server, root, serving_model: ServingModel
) -> None:
    body = {"instances": [instance(sample_inputs(1), 0)]}
    results: list[tuple[int, Any]] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            results.append(http(server, "POST", "/v1/models/swap:predict", body))

    clients = [threading.Thread(target=client) for _ in range(4)]
    for thread in clients:
        thread.start()
    try:
        wait_until(lambda: len(results) > 20, "traffic on version 1", timeout=60)
        serving_model.publish(root, 2, name="swap")
        wait_until(
            lambda: states(server, "swap").get("1", {}).get("state") == "END",
            "version 1 unloaded",
            timeout=60,
        )
        served = len(results)
        wait_until(lambda: len(results) > served + 20, "traffic on version 2", timeout=60)
    finally:
        stop.set()
        for thread in clients:
            thread.join(30)
    failures = [result for result in results if result[0] != 200]
    assert failures == []
    assert states(server, "swap")["2"]["state"] == "AVAILABLE"


def test_a_tampered_version_is_refused_while_the_others_serve(
    server, root, serving_model: ServingModel
) -> None:
    staging = root / "guarded" / ".staging-tampered"
    serving_model.write_version(staging, name="guarded")
    variables = next((staging / "variables").glob("variables.data-*"))
    data = variables.read_bytes()
    variables.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # same size, other bytes
    staging.rename(root / "guarded" / "2")
    wait_until(
        lambda: states(server, "guarded").get("2", {}).get("state") == "END",
        "version 2 refused",
        timeout=60,
    )
    refused = states(server, "guarded")["2"]["status"]
    assert refused["error_code"] == "DATA_LOSS"
    assert "SHA-256 does not match" in refused["error_message"]
    assert states(server, "guarded")["1"]["state"] == "AVAILABLE"
    status, answer = http(
        server,
        "POST",
        "/v1/models/guarded:predict",
        {"instances": [instance(sample_inputs(1), 0)]},
    )
    assert status == 200 and len(answer["predictions"]) == 1
    shutil.rmtree(root / "guarded" / "2")
