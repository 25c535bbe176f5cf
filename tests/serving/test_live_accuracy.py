"""Live accuracy end to end: series at 0 before the first request, request ids on every
answer, feedback over REST and gRPC, and PredictionLog files read back with TensorFlow."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import struct_pb2
from prometheus_client.parser import text_string_to_metric_families
from tensorflow_serving.apis import (
    classification_pb2,
    prediction_log_pb2,
    prediction_service_pb2_grpc,
)

from serving.config import GatewayConfig
from serving.metrics import STATUS_CODES
from serving.process import GatewayProcess
from serving.request_id import id_fraction
from serving.tensors import tensor_proto_to_numpy
from tests.support.gateways import GatewayThread
from tests.support.grpc_requests import predict_request
from tests.support.http import fetch
from tests.support.serving_models import ServingModel, sample_inputs, sample_instances

pytestmark = pytest.mark.timeout(180)

FEEDBACK_METHOD = "/slipway.serving.FeedbackService/SendFeedback"


@pytest.fixture(scope="module")
def stub(server: GatewayThread) -> Iterator[prediction_service_pb2_grpc.PredictionServiceStub]:
    with grpc.insecure_channel(server.grpc_target) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, serving_model: ServingModel
) -> Iterator[GatewayThread]:
    root = tmp_path_factory.mktemp("accuracy") / "models"
    serving_model.publish(root, 1)
    serving_model.publish(root, 1, name="fresh")  # no request ever reaches it before a scrape
    config = GatewayConfig.model_validate({"batching": {"batch_timeout_micros": 1000}})
    with GatewayThread(root, config) as thread:
        yield thread


def scrape(server: GatewayThread) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text, _ = fetch(server.rest_url + "/metrics", "GET")
    assert status == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def requests_series(model: str, code: str, api: str, route: str = "stable") -> tuple:
    labels = {"model": model, "version": "1", "route": route, "code": code, "api": api}
    return ("slipway_gateway_requests_total", tuple(sorted(labels.items())))


def feedback_series(outcome: str, model: str = "digits", route: str = "stable") -> tuple:
    labels = {"model": model, "version": "1", "route": route, "outcome": outcome}
    return ("slipway_gateway_feedback_total", tuple(sorted(labels.items())))


# -- 1. series that exist before the first event ------------------------------------------


def test_series_exist_at_zero_after_load_and_one_failure_makes_exactly_one(
    server: GatewayThread,
) -> None:
    before = scrape(server)
    expected = {
        requests_series("fresh", code, api, route)
        for code in STATUS_CODES
        for api in ("grpc", "rest")
        for route in ("stable", "canary", "shadow", "explicit")
    }
    assert expected <= set(before)
    assert all(before[key] == 0 for key in expected)
    for route in ("stable", "canary", "explicit"):
        for outcome in ("correct", "incorrect"):
            assert before[feedback_series(outcome, "fresh", route)] == 0

    status, _, _ = fetch(
        server.rest_url + "/v1/models/fresh:predict", "POST", {"instances": [{"image": [1]}]}
    )
    assert status == 400
    after = scrape(server)
    failed = requests_series("fresh", "INVALID_ARGUMENT", "rest")
    assert after[failed] == 1
    assert all(after[key] == 0 for key in expected - {failed})


# -- 2. request ids -------------------------------------------------------------------------


def test_grpc_answers_carry_a_request_id_in_metadata(
    stub: prediction_service_pb2_grpc.PredictionServiceStub,
) -> None:
    response, call = stub.Predict.with_call(predict_request(), timeout=30)
    assert response.model_spec.version.value == 1  # the TF Serving response is unchanged
    generated = dict(call.trailing_metadata())["x-request-id"]
    assert len(generated) == 32
    _, call = stub.Predict.with_call(
        predict_request(), metadata=(("x-request-id", "client-7"),), timeout=30
    )
    assert dict(call.trailing_metadata())["x-request-id"] == "client-7"

    with pytest.raises(grpc.RpcError) as missing:
        stub.Predict(predict_request(model="nope"), metadata=(("x-request-id", "c-8"),), timeout=30)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert dict(missing.value.trailing_metadata())["x-request-id"] == "c-8"
    with pytest.raises(grpc.RpcError) as invalid:
        stub.Predict(predict_request(), metadata=(("x-request-id", "x" * 129),), timeout=30)
    assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "x-request-id" in invalid.value.details()
    assert len(dict(invalid.value.trailing_metadata())["x-request-id"]) == 32


def test_rest_answers_carry_a_request_id_header(server: GatewayThread) -> None:
    url = server.rest_url + "/v1/models/digits:predict"
    status, _, headers = fetch(url, "POST", sample_instances())
    assert status == 200 and len(headers["X-Request-Id"]) == 32
    status, _, headers = fetch(url, "POST", sample_instances(), {"X-Request-Id": "mine-1"})
    assert status == 200 and headers["X-Request-Id"] == "mine-1"
    status, _, headers = fetch(server.rest_url + "/v1/models/nope", "GET")
    assert status == 404 and len(headers["X-Request-Id"]) == 32
    status, body, headers = fetch(url, "POST", sample_instances(), {"X-Request-Id": "a\tb"})
    assert status == 400 and "x-request-id" in body["error"]
    assert len(headers["X-Request-Id"]) == 32


# -- 4. feedback -----------------------------------------------------------------------------


def test_rest_feedback_counts_correct_and_incorrect_rows_once(server: GatewayThread) -> None:
    url = server.rest_url + "/v1/models/digits"
    status, body, _ = fetch(
        url + ":predict", "POST", sample_instances(2, seed=3), {"X-Request-Id": "fb-1"}
    )
    assert status == 200
    served = [int(np.argmax(row["label"])) for row in body["predictions"]]
    before = scrape(server)
    labels = [served[0], (served[1] + 1) % 10]
    status, answer, headers = fetch(
        url + "/feedback", "POST", {"request_id": "fb-1", "labels": labels}
    )
    assert status == 200, answer
    assert "X-Request-Id" in headers
    assert answer["rows"] == [{"row": 0, "outcome": "correct"}, {"row": 1, "outcome": "incorrect"}]
    after = scrape(server)
    for outcome in ("correct", "incorrect"):
        assert after[feedback_series(outcome)] == before[feedback_series(outcome)] + 1

    status, answer, _ = fetch(
        url + "/feedback", "POST", {"request_id": "fb-1", "row": 0, "label": 1}
    )
    assert status == 409 and "already has a label" in answer["error"]
    status, answer, _ = fetch(url + "/feedback", "POST", {"request_id": "never", "label": 1})
    assert status == 404 and "unknown or expired" in answer["error"]
    status, answer, _ = fetch(url + "/feedback", "POST", {"request_id": "fb-1", "lable": 1})
    assert status == 400 and "lable" in answer["error"]
    status, _, _ = fetch(url + "/versions/1/feedback", "POST", {"request_id": "fb-1", "label": 1})
    assert status == 400
    assert scrape(server)[feedback_series("correct")] == after[feedback_series("correct")]


def test_grpc_feedback_on_a_classify_answer_by_class_name(
    server: GatewayThread, stub: prediction_service_pb2_grpc.PredictionServiceStub
) -> None:
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "digits"
    inputs = sample_inputs(1, seed=5)
    example = request.input.example_list.examples.add()
    example.features.feature["image"].float_list.value.extend(inputs["image"].ravel().tolist())
    example.features.feature["extra"].int64_list.value.extend(inputs["extra"].ravel().tolist())
    response, call = stub.Classify.with_call(request, timeout=30)
    request_id = dict(call.trailing_metadata())["x-request-id"]
    classes = response.result.classifications[0].classes
    top = max(classes, key=lambda entry: entry.score).label

    with grpc.insecure_channel(server.grpc_target) as channel:
        send = channel.unary_unary(
            FEEDBACK_METHOD,
            request_serializer=struct_pb2.Struct.SerializeToString,
            response_deserializer=struct_pb2.Struct.FromString,
        )
        feedback = struct_pb2.Struct()
        feedback.update({"model": "digits", "request_id": request_id, "label": top})
        answer = send(feedback, timeout=30)
        assert answer["request_id"] == request_id
        assert answer["rows"][0]["outcome"] == "correct"
        for body, code in [
            ({"model": "digits", "request_id": "never", "label": 1}, grpc.StatusCode.NOT_FOUND),
            ({"request_id": request_id, "label": 1}, grpc.StatusCode.INVALID_ARGUMENT),
            ({"model": "digits", "request_id": request_id, "label": 1},
             grpc.StatusCode.ALREADY_EXISTS),
        ]:  # fmt: skip
            bad = struct_pb2.Struct()
            bad.update(body)
            with pytest.raises(grpc.RpcError) as failed:
                send(bad, timeout=30)
            assert failed.value.code() == code


# -- 3. prediction logs -------------------------------------------------------------------------


def read_logs(directory: Path) -> list[prediction_log_pb2.PredictionLog]:
    assert not list(directory.glob("*.part")), "a file was left unfinished"
    files = sorted(str(path) for path in directory.glob("*.tfrecord"))
    return [
        prediction_log_pb2.PredictionLog.FromString(record.numpy())
        for record in tf.data.TFRecordDataset(files)
    ]


def sampled_ids(prefix: str, count: int, fraction: float = 0.5) -> list[str]:
    """The first ``count`` ids ``prefix-N`` a sample of ``fraction`` logs."""
    ids = (f"{prefix}-{n}" for n in range(10_000))
    return [i for i in ids if id_fraction(i) < fraction][:count]


def test_prediction_logs_hold_grpc_and_rest_predicts_sampled_by_request_id(
    tmp_path: Path,
    serving_model: ServingModel,
) -> None:
    root = tmp_path / "models"
    serving_model.publish(root, 1)
    config = GatewayConfig.model_validate(
        {"prediction_log": {"directory": str(tmp_path / "logs"), "sample": 0.5,
                            "max_file_bytes": 4096}}
    )  # fmt: skip
    grpc_id, rest_id = sampled_ids("grpc", 1)[0], sampled_ids("rest", 1)[0]
    batch_ids = [f"batch-{n}" for n in range(40)]
    with GatewayThread(root, config) as server:
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            grpc_answer = stub.Predict(
                predict_request(rows=2), metadata=(("x-request-id", grpc_id),), timeout=30
            )
        url = server.rest_url + "/v1/models/digits:predict"
        for request_id in [rest_id, *batch_ids]:
            status, _, _ = fetch(url, "POST", sample_instances(), {"X-Request-Id": request_id})
            assert status == 200
    logs = {log.log_metadata.request_origin: log for log in read_logs(tmp_path / "logs")}
    assert len(list((tmp_path / "logs").glob("*.tfrecord"))) > 1  # rotated by size

    expected = {i for i in batch_ids if id_fraction(i) < 0.5}
    assert set(logs) - {grpc_id, rest_id} == expected
    assert 10 <= len(expected) <= 30
    for request_id in (grpc_id, rest_id):
        metadata = logs[request_id].log_metadata
        assert metadata.model_spec.name == "digits"
        assert metadata.model_spec.version.value == 1
        assert metadata.model_spec.signature_name == "serving_default"
        assert metadata.sampling_config.sampling_rate == 0.5
        assert metadata.timestamp_secs > 0
    logged = logs[grpc_id].predict_log
    sent = sample_inputs(2)
    for name in ("image", "extra"):
        np.testing.assert_array_equal(
            tensor_proto_to_numpy(logged.request.inputs[name]), sent[name]
        )
    for name in ("label", "value"):
        np.testing.assert_array_equal(
            tensor_proto_to_numpy(logged.response.outputs[name]),
            tensor_proto_to_numpy(grpc_answer.outputs[name]),
        )
    rest_logged = logs[rest_id].predict_log
    assert tensor_proto_to_numpy(rest_logged.request.inputs["image"]).shape == (1, 8, 8, 1)
    assert tensor_proto_to_numpy(rest_logged.response.outputs["label"]).shape == (1, 10)


@pytest.mark.process
def test_sigterm_closes_the_prediction_log_of_a_gateway_started_with_the_flags(
    tmp_path: Path,
    serving_model: ServingModel,
) -> None:
    root = tmp_path / "models"
    serving_model.publish(root, 1)
    logs = tmp_path / "logs"

    class LoggingGateway(GatewayProcess):
        def command(self) -> list[str]:
            flags = ["--prediction-log-dir", str(logs), "--prediction-log-sample", "1"]
            return [*super().command(), *flags]

    with LoggingGateway(root) as gateway:
        status, _, headers = fetch(
            gateway.rest_url + "/v1/models/digits:predict", "POST", sample_instances(),
            {"X-Request-Id": "last-words"},
        )  # fmt: skip
        assert status == 200
        gateway.terminate()
        assert gateway.wait() == 0
    assert [log.log_metadata.request_origin for log in read_logs(logs)] == ["last-words"]
