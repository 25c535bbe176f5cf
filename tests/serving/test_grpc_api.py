"""The gRPC API end to end, through TensorFlow Serving's own client stubs.

One gateway serves a small repository for the whole module: ``digits`` (versions 1 and
2), ``queued`` (slow batches, tiny queue) and ``flaky`` (version 2 rejects what version
1 accepts, for failover).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tensorflow.core.example.example_pb2 import Example
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from serving.config import GatewayConfig
from serving.routing import ModelRouting
from serving.tensors import tensor_proto_to_numpy
from tests.support.gateways import GatewayThread
from tests.support.grpc_requests import predict_request
from tests.support.serving_models import CLASSES, ServingModel, sample_inputs
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

# A batch window no test outlives: requests to ``queued`` leave its batch only by their
# own deadline (which cuts the batch in time) or by being refused, never because the
# window closed, however slow the machine.
NEVER_CUT_MICROS = 600_000_000
# ``together`` cuts a batch only when it holds this many rows.
TOGETHER_ROWS = 48

TOKEN = "s3cret-admin-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


def write_incompatible_version(directory: Path) -> None:
    """A plain SavedModel like digits but whose ``extra`` input has 4 columns, not 3."""

    class Model(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 8, 8, 1], tf.float32, name="image"),
                tf.TensorSpec([None, 4], tf.int64, name="extra"),
            ]
        )
        def serve(self, image: tf.Tensor, extra: tf.Tensor) -> dict[str, tf.Tensor]:
            batch = tf.shape(image)[0]
            return {"label": tf.zeros([batch, 10]), "value": tf.zeros([batch, 1])}

    module = Model()
    tf.saved_model.save(module, str(directory), signatures={"serving_default": module.serve})


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, serving_model: ServingModel
) -> Iterator[GatewayThread]:
    base = tmp_path_factory.mktemp("grpc")
    root = base / "models"
    for version in (1, 2):
        serving_model.publish(root, version)
    serving_model.publish(root, 1, name="queued")
    serving_model.publish(root, 1, name="together")
    serving_model.publish(root, 1, name="flaky")
    write_incompatible_version(root / "flaky" / "2")
    (base / "token").write_text(TOKEN)
    config = GatewayConfig.model_validate(
        {
            "routing_file": str(base / "routing.yaml"),
            "poll_interval_s": 0.2,
            "admin": {"token_file": str(base / "token")},
            "batching": {"max_batch_size": 32, "batch_timeout_micros": 20000},
            "models": {
                "digits": {"version_policy": {"kind": "all"}},
                "flaky": {"version_policy": {"kind": "all"}},
                "queued": {
                    "batching": {
                        "max_batch_size": 4,
                        "max_enqueued_batches": 1,
                        "batch_timeout_micros": NEVER_CUT_MICROS,
                    }
                },
                "together": {
                    "batching": {
                        "max_batch_size": TOGETHER_ROWS,
                        "batch_timeout_micros": NEVER_CUT_MICROS,
                    }
                },
            },
        }
    )
    with GatewayThread(root, config) as thread:
        yield thread


@pytest.fixture(scope="module")
def channel(server: GatewayThread) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_target) as open_channel:
        yield open_channel


@pytest.fixture(scope="module")
def predictions(channel: grpc.Channel) -> prediction_service_pb2_grpc.PredictionServiceStub:
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="module")
def models(channel: grpc.Channel) -> model_service_pb2_grpc.ModelServiceStub:
    return model_service_pb2_grpc.ModelServiceStub(channel)


def outputs_of(response: predict_pb2.PredictResponse) -> dict[str, np.ndarray]:
    return {name: tensor_proto_to_numpy(proto) for name, proto in response.outputs.items()}


def examples(count: int) -> list[Example]:
    inputs = sample_inputs(count, seed=3)
    made = []
    for index in range(count):
        example = Example()
        features = example.features.feature
        features["image"].float_list.value.extend(inputs["image"][index].ravel().tolist())
        features["extra"].int64_list.value.extend(inputs["extra"][index].tolist())
        made.append(example)
    return made


def rpc_error(call: object, *args: object, **kwargs: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, **kwargs)  # type: ignore[operator]
    return caught.value


def set_labels(models: model_service_pb2_grpc.ModelServiceStub, model: str, **labels: int) -> None:
    request = model_management_pb2.ReloadConfigRequest()
    entry = request.config.model_config_list.config.add(name=model, model_platform="tensorflow")
    for name, version in labels.items():
        entry.version_labels[name] = version
    response = models.HandleReloadConfigRequest(request, metadata=AUTH, timeout=10)
    assert response.status.error_code == 0


# -- PredictionService --------------------------------------------------------------------


def test_predict_by_name_answers_like_the_model_from_the_highest_version(
    predictions, serving_model: ServingModel
) -> None:
    inputs = sample_inputs(3)
    response = predictions.Predict(predict_request(inputs=inputs), timeout=10)
    assert response.model_spec.name == "digits"
    assert response.model_spec.version.value == 2
    assert response.model_spec.signature_name == "serving_default"
    expected = serving_model.keras_outputs(inputs)
    for name, array in outputs_of(response).items():
        np.testing.assert_allclose(array, expected[name], rtol=1e-5, atol=1e-6)


def test_predict_by_version_and_output_filter(predictions) -> None:
    request = predict_request(version=1)
    request.output_filter.append("label")
    response = predictions.Predict(request, timeout=10)
    assert response.model_spec.version.value == 1
    assert list(response.outputs) == ["label"]


def test_reload_config_sets_labels_that_route_requests(predictions, models) -> None:
    set_labels(models, "digits", stable=1, canary=2)
    assert (
        predictions.Predict(predict_request(label="stable"), timeout=10).model_spec.version.value
        == 1
    )
    assert (
        predictions.Predict(predict_request(label="canary"), timeout=10).model_spec.version.value
        == 2
    )
    # No version or label and no canary weight: stable takes the traffic.
    assert predictions.Predict(predict_request(), timeout=10).model_spec.version.value == 1
    status = models.GetModelStatus(
        get_model_status_pb2.GetModelStatusRequest(
            model_spec={"name": "digits", "version_label": "canary"}
        ),
        timeout=10,
    )
    assert [s.version for s in status.model_version_status] == [2]


def test_reload_config_refuses_unknown_models_and_unavailable_versions(models) -> None:
    request = model_management_pb2.ReloadConfigRequest()
    request.config.model_config_list.config.add(name="nope").version_labels["stable"] = 1
    error = rpc_error(models.HandleReloadConfigRequest, request, metadata=AUTH, timeout=10)
    assert error.code() == grpc.StatusCode.NOT_FOUND
    request = model_management_pb2.ReloadConfigRequest()
    request.config.model_config_list.config.add(name="digits").version_labels["stable"] = 7
    error = rpc_error(models.HandleReloadConfigRequest, request, metadata=AUTH, timeout=10)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "version 7" in error.details()


def test_sticky_keys_keep_a_user_on_one_side_of_the_canary_split(
    server, predictions, models
) -> None:
    set_labels(models, "digits", stable=1, canary=2)
    routing = ModelRouting(
        labels={"stable": 1, "canary": 2}, canary_weight=0.5, sticky_header="x-user"
    )
    server.run(server.gateway.set_model_routing("digits", routing))
    seen: dict[str, set[int]] = {}
    for user in range(20):
        for _ in range(2):
            response = predictions.Predict(
                predict_request(), metadata=(("x-user", f"user-{user}"),), timeout=10
            )
            seen.setdefault(f"user-{user}", set()).add(response.model_spec.version.value)
    assert all(len(versions) == 1 for versions in seen.values())
    assert set().union(*seen.values()) == {1, 2}
    canary = server.metric(
        "slipway_gateway_requests_total",
        {"model": "digits", "version": "2", "route": "canary", "code": "OK", "api": "grpc"},
    )
    assert canary > 0
    server.run(
        server.gateway.set_model_routing("digits", ModelRouting(labels={"stable": 1, "canary": 2}))
    )


def test_shadow_traffic_is_mirrored_and_compared(server, predictions) -> None:
    routing = ModelRouting(
        labels={"stable": 1, "canary": 2}, shadow={"label": "canary", "percent": 100}
    )
    server.run(server.gateway.set_model_routing("digits", routing))
    labels = {"model": "digits", "version": "2"}
    before = server.metric("slipway_gateway_shadow_agreement_count", labels)
    for _ in range(5):
        request = predict_request(rows=2)  # two rows each: every row is compared
        assert predictions.Predict(request, timeout=10).model_spec.version.value == 1
    wait_until(
        lambda: server.metric("slipway_gateway_shadow_agreement_count", labels) >= before + 5,
        "five mirrored requests to be compared",
    )
    # Versions 1 and 2 are the same model: they agree on every row.
    assert server.metric("slipway_gateway_shadow_abs_diff_sum", labels) == 0
    assert server.metric("slipway_gateway_shadow_agreement_sum", labels) == server.metric(
        "slipway_gateway_shadow_agreement_count", labels
    )
    server.run(
        server.gateway.set_model_routing("digits", ModelRouting(labels={"stable": 1, "canary": 2}))
    )


def test_a_failing_canary_fails_over_to_stable_and_counts_against_the_canary(
    server, predictions
) -> None:
    routing = ModelRouting(labels={"stable": 1, "canary": 2}, canary_weight=1.0, failover=True)
    server.run(server.gateway.set_model_routing("flaky", routing))
    response = predictions.Predict(predict_request("flaky"), timeout=10)
    assert response.model_spec.version.value == 1
    failed = server.metric(
        "slipway_gateway_requests_total",
        {
            "model": "flaky",
            "version": "2",
            "route": "canary",
            "code": "INVALID_ARGUMENT",
            "api": "grpc",
        },
    )
    assert failed == 1
    assert (
        server.metric(
            "slipway_gateway_failovers_total",
            {"model": "flaky", "from_version": "2", "to_version": "1"},
        )
        == 1
    )
    # An explicit request for the canary still goes exactly there, and fails there.
    error = rpc_error(predictions.Predict, predict_request("flaky", label="canary"), timeout=10)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "expected int64 [-1, 4]" in error.details()


def test_classify_names_the_classes_from_slipway_json(
    predictions, serving_model: ServingModel
) -> None:
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "digits"
    request.model_spec.version.value = 2
    request.input.example_list.examples.extend(examples(3))
    response = predictions.Classify(request, timeout=10)
    expected = serving_model.keras_outputs(sample_inputs(3, seed=3))["label"]
    assert len(response.result.classifications) == 3
    for row, scores in zip(response.result.classifications, expected, strict=True):
        assert [c.label for c in row.classes] == CLASSES
        np.testing.assert_allclose([c.score for c in row.classes], scores, rtol=1e-5)


def test_classify_with_context_shares_features_across_examples(predictions) -> None:
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "digits"
    listed = request.input.example_list_with_context
    for example in examples(2):
        del example.features.feature["extra"]
        listed.examples.append(example)
    listed.context.features.feature["extra"].int64_list.value.extend([1, 2, 3])
    response = predictions.Classify(request, timeout=10)
    assert len(response.result.classifications) == 2


def test_regress_returns_one_value_per_example(predictions, serving_model: ServingModel) -> None:
    request = regression_pb2.RegressionRequest()
    request.model_spec.name = "digits"
    request.model_spec.version.value = 2
    request.input.example_list.examples.extend(examples(3))
    response = predictions.Regress(request, timeout=10)
    expected = serving_model.keras_outputs(sample_inputs(3, seed=3))["value"]
    np.testing.assert_allclose(
        [r.value for r in response.result.regressions], expected[:, 0], rtol=1e-5
    )


def test_multi_inference_runs_classify_and_regress_on_one_input(predictions) -> None:
    request = inference_pb2.MultiInferenceRequest()
    request.tasks.add(model_spec={"name": "digits"}, method_name="tensorflow/serving/classify")
    request.input.example_list.examples.extend(examples(2))
    response = predictions.MultiInference(request, timeout=10)
    assert len(response.results[0].classification_result.classifications) == 2


def test_examples_with_wrong_feature_types_are_invalid_arguments(predictions) -> None:
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "digits"
    example = examples(1)[0]
    example.features.feature["extra"].Clear()
    example.features.feature["extra"].float_list.value.extend([1.0, 2.0, 3.0])
    request.input.example_list.examples.append(example)
    error = rpc_error(predictions.Classify, request, timeout=10)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "expected int64_list" in error.details()


def test_get_model_metadata_describes_the_signature(predictions) -> None:
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "digits"
    request.model_spec.version.value = 1
    response = predictions.GetModelMetadata(request, timeout=10)
    assert response.model_spec.version.value == 1
    signatures = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signatures)
    signature = signatures.signature_def["serving_default"]
    assert set(signature.inputs) == {"image", "extra"}
    assert [d.size for d in signature.inputs["image"].tensor_shape.dim] == [-1, 8, 8, 1]
    assert set(signature.outputs) == {"label", "value"}


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [
        (predict_request("nope"), grpc.StatusCode.NOT_FOUND, "'nope'"),
        (predict_request("../models/digits"), grpc.StatusCode.NOT_FOUND, "not served here"),
        (predict_request(version=9), grpc.StatusCode.NOT_FOUND, "available versions: 1, 2"),
        (predict_request(label="gold"), grpc.StatusCode.INVALID_ARGUMENT, "gold"),
        (
            predict_request(signature="other"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "serving_default",
        ),
        (
            predict_request(inputs={"image": np.zeros((1, 8, 8, 1), np.float32)}),
            grpc.StatusCode.INVALID_ARGUMENT,
            "missing input 'extra'",
        ),
        (
            predict_request(
                inputs={
                    "image": np.zeros((1, 8, 8), np.float32),
                    "extra": np.zeros((1, 3), np.int64),
                }
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "expected float32 [-1, 8, 8, 1], got float32 [1, 8, 8]",
        ),
        (
            predict_request(
                inputs={
                    "image": np.zeros((1, 8, 8, 1), np.float32),
                    "extra": np.zeros((1, 3), np.float32),
                }
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "expected int64 [-1, 3]",
        ),
    ],
)
def test_bad_requests_get_a_precise_status(predictions, request_, code, message) -> None:
    error = rpc_error(predictions.Predict, request_, timeout=10)
    assert error.code() == code
    assert message in error.details()


def test_a_malformed_tensor_proto_is_an_invalid_argument(predictions) -> None:
    request = predict_request()
    request.inputs["image"].tensor_content = b"\x00" * 7
    error = rpc_error(predictions.Predict, request, timeout=10)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tensor_content" in error.details()


def test_concurrent_requests_are_batched_and_answered_as_if_alone(server, predictions) -> None:
    requests = [sample_inputs(1 + i % 3, seed=i) for i in range(24)]
    rows = sum(len(r["image"]) for r in requests)
    assert rows == TOGETHER_ROWS  # so they fill one batch of ``together`` exactly
    alone = [
        outputs_of(predictions.Predict(predict_request(inputs=r, version=1), timeout=10))
        for r in requests
    ]
    labels = {"model": "together", "version": "1"}
    batches_before = server.metric("slipway_gateway_batch_size_count", labels)
    rows_before = server.metric("slipway_gateway_batch_size_sum", labels)
    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        together = list(
            pool.map(
                lambda r: outputs_of(
                    predictions.Predict(predict_request("together", inputs=r), timeout=60)
                ),
                requests,
            )
        )
    for single, batched in zip(alone, together, strict=True):
        for name in single:
            np.testing.assert_allclose(batched[name], single[name], rtol=1e-5, atol=1e-6)
    assert server.metric("slipway_gateway_batch_size_count", labels) - batches_before == 1
    assert server.metric("slipway_gateway_batch_size_sum", labels) - rows_before == rows


def test_a_deadline_shorter_than_the_batch_window_is_answered_in_time(server, predictions) -> None:
    # ``queued`` never cuts a batch by its window: the call's own deadline must (at the
    # latest start it leaves, a tenth of its 5 s before the end).
    labels = {"model": "queued", "version": "1"}
    executed = server.metric("slipway_gateway_batch_size_count", labels)
    response = predictions.Predict(predict_request("queued"), timeout=5)
    assert response.model_spec.version.value == 1
    assert server.metric("slipway_gateway_batch_size_count", labels) == executed + 1


def test_more_rows_than_the_queue_ever_holds_is_invalid_not_unavailable(predictions) -> None:
    # 10 rows need 3 batches of 4, but only one batch may ever wait: retrying cannot help.
    error = rpc_error(predictions.Predict, predict_request("queued", sample_inputs(10)), timeout=10)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the request has 10 rows, more than the batch queue ever holds" in error.details()


# -- health, reflection --------------------------------------------------------------------


def test_health_is_reported_per_model_and_overall(channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "digits", "queued"):
        response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert response.status == health_pb2.HealthCheckResponse.SERVING
    error = rpc_error(health.Check, health_pb2.HealthCheckRequest(service="nope"), timeout=10)
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_the_tensorflow_serving_services(channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    (response,) = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
    names = {service.name for service in response.list_services_response.service}
    assert {
        "tensorflow.serving.PredictionService",
        "tensorflow.serving.ModelService",
        "grpc.health.v1.Health",
    } <= names
