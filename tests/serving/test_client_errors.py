"""What clients see in errors: no filesystem path of the server, and their own input
echoed back at most ``MAX_ECHO_CHARS`` characters long."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving.config import GatewayConfig
from serving.errors import MAX_ECHO_CHARS, client_message
from tests.support.gateways import GatewayThread
from tests.support.http import http
from tests.support.serving_models import ServingModel

pytestmark = pytest.mark.timeout(180)

LONG = "m" * 10_000


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, serving_model: ServingModel) -> Path:
    root = tmp_path_factory.mktemp("secret-place") / "models"
    serving_model.publish(root, 1)
    (root / "broken" / "1").mkdir(parents=True)  # a version with no model in it
    (root / "broken" / "1" / "README").write_text("nothing here\n")
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[GatewayThread]:
    with GatewayThread(root, GatewayConfig(poll_interval_s=0.2)) as thread:
        yield thread


@pytest.fixture(scope="module")
def channel(server: GatewayThread) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_target) as channel:
        yield channel


def test_a_failed_version_status_does_not_show_the_model_root(server, root, channel) -> None:
    status, body = http(server, "GET", "/v1/models/broken")
    assert status == 200
    message = body["model_version_status"][0]["status"]["error_message"]
    assert "no saved_model.pb" in message
    assert str(root) not in message and "secret-place" not in message
    assert message.startswith("<model root>/broken/1")
    stub = model_service_pb2_grpc.ModelServiceStub(channel)
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "broken"
    answer = stub.GetModelStatus(request, timeout=30)
    assert answer.model_version_status[0].status.error_message == message


def test_a_long_model_name_is_echoed_short(server, channel) -> None:
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = LONG
    with pytest.raises(grpc.RpcError) as error:
        stub.Predict(request, timeout=30)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert "m" * (MAX_ECHO_CHARS - 1) + "…'" in error.value.details()
    assert len(error.value.details()) < 300
    request.model_spec.name = "digits"
    request.model_spec.version_label = "l" * 10_000
    with pytest.raises(grpc.RpcError) as error:
        stub.Predict(request, timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(error.value.details()) < 300
    # REST: URLs are short, bodies are not.
    status, body = http(server, "GET", f"/v1/models/{'m' * 4000}")
    assert status == 404 and len(body["error"]) < 300
    status, body = http(server, "POST", f"/v1/models/{'m' * 4000}/labels/x:predict", {})
    assert status == 404 and len(body["error"]) < 300
    status, body = http(
        server, "POST", "/v1/models/digits:predict", {"signature_name": LONG, "instances": [1]}
    )
    assert status == 400 and len(body["error"]) < 400 and "…" in body["error"]


def test_client_message_cleans_paths_and_long_tokens(caplog) -> None:
    roots = [("/srv/models", "<model root>")]
    assert (
        client_message("/srv/models/d/1: no saved_model.pb", roots)
        == "<model root>/d/1: no saved_model.pb"
    )
    cleaned = client_message("No such file: '/etc/app/vocab.txt' (see /opt/x/y)", roots)
    assert cleaned == "No such file: '<server path>' (see <server path>)"
    # The gateway's own REST paths and URLs are not server paths.
    text = "feedback names the model only (POST /v1/models/{model}/feedback); http://h/a/b"
    assert client_message(text) == text
    cleaned = client_message(f"model '{LONG}' not found")
    assert cleaned == f"model '{'m' * (MAX_ECHO_CHARS - 1)}…' not found"
    assert len(client_message("x " * 10_000)) <= 4097


def test_the_server_log_keeps_the_full_message(server, root, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="serving.gateway"):
        cleaned = server.gateway.client_message(f"{root}/digits/1/variables: unreadable")
    assert cleaned == "<model root>/digits/1/variables: unreadable"
    assert any(str(root) in record.getMessage() for record in caplog.records)
