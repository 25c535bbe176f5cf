"""Hostile and odd tensors against a running gateway: a few bytes that declare a huge
tensor, shapes numpy cannot hold, a type the signature does not take, and scalars over
REST. Each is the client's error (INVALID_ARGUMENT / HTTP 400) or works; none is
INTERNAL, and none makes the gateway allocate what the request did not send."""

from __future__ import annotations

import base64
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework.tensor_pb2 import TensorProto
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving.config import GatewayConfig
from serving.errors import FailedPrecondition
from serving.inference_results import top_classes, values_from_outputs
from serving.tensors import numpy_to_tensor_proto
from tests.support.gateways import GatewayThread
from tests.support.http import http
from tests.support.tensors import proto

pytestmark = pytest.mark.timeout(180)


def save(directory: Path, specs: dict[str, tf.TensorSpec], body: Any) -> None:
    names = list(specs)

    class Model(tf.Module):
        @tf.function(input_signature=[specs[name] for name in names])
        def serve(self, *args: tf.Tensor) -> dict[str, tf.Tensor]:
            return body(**dict(zip(names, args, strict=True)))

    module = Model()
    tf.saved_model.save(module, str(directory), signatures={"serving_default": module.serve})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    root = tmp_path_factory.mktemp("hostile") / "models"
    # TF Serving's half_plus_two, on a scalar.
    save(
        root / "half" / "1",
        {"x": tf.TensorSpec([], tf.float32, name="x")},
        lambda x: {"y": x * 0.5 + 2.0},
    )
    save(
        root / "wide" / "1",
        {"x": tf.TensorSpec([None, 16383], tf.float32, name="x")},
        lambda x: {"y": tf.reduce_sum(x, axis=1)},
    )
    save(
        root / "length" / "1",
        {"s": tf.TensorSpec([], tf.string, name="s")},
        lambda s: {"n": tf.strings.length(s)},
    )
    save(
        root / "pair" / "1",
        {
            "x": tf.TensorSpec([None], tf.float32, name="x"),
            "ids": tf.TensorSpec([None], tf.int64, name="ids"),
        },
        lambda x, ids: {"y": x + tf.cast(ids, tf.float32)},
    )
    config = GatewayConfig.model_validate({"poll_interval_s": 0.2})
    with GatewayThread(root, config) as thread:
        yield thread


@pytest.fixture(scope="module")
def stub(server: GatewayThread) -> Iterator[prediction_service_pb2_grpc.PredictionServiceStub]:
    with grpc.insecure_channel(server.grpc_target) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def request(model: str, **inputs: TensorProto) -> predict_pb2.PredictRequest:
    message = predict_pb2.PredictRequest()
    message.model_spec.name = model
    for name, tensor in inputs.items():
        message.inputs[name].CopyFrom(tensor)
    return message


def rpc_error(stub, message: predict_pb2.PredictRequest) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        stub.Predict(message, timeout=60)
    return caught.value


def post(server: GatewayThread, path: str, body: Any) -> tuple[int, Any]:
    """A JSON POST that may take a loaded gateway a while to refuse."""
    return http(server, "POST", path, body, timeout=60)


# -- a few bytes that declare a huge tensor ----------------------------------------------


@pytest.mark.parametrize(
    ("model", "tensor"),
    [
        ("wide", proto(1, [16384, 16383], float_val=[1.0])),
        ("half", proto(1, [16384, 16383], float_val=[1.0])),
        ("wide", proto(1, [1 << 20, 16383], float_val=[1.0, 2.0])),
        ("wide", proto(9, [16384, 16383], int64_val=[3])),
        ("length", proto(7, [1 << 16, 1 << 14], string_val=[b"x"])),
        ("wide", proto(1, [4096, 4096])),
    ],
    ids=["the-36-byte-request", "scalar-model", "two-values", "int64", "strings", "no-values"],
)
def test_a_tiny_request_for_a_huge_tensor_allocates_nothing(stub, model, tensor) -> None:
    message = request(model, **{"s" if model == "length" else "x": tensor})
    assert message.ByteSize() < 64
    tracemalloc.start()
    try:
        error = rpc_error(stub, message)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert peak < 4 << 20, f"peak {peak / 2**20:.0f} MiB"


def test_a_broadcast_the_signature_accepts_and_the_size_allows_runs(stub) -> None:
    response = stub.Predict(request("wide", x=proto(1, [3, 16383], float_val=[0.5])), timeout=60)
    np.testing.assert_allclose(tf.make_ndarray(response.outputs["y"]), [16383 * 0.5] * 3)


# -- odd shapes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (proto(1, [0, 2**62]), "too large"),
        (proto(1, [2, -5], float_val=[1.0]), "negative dimension"),
        (proto(1, [1] * 65, float_val=[1.0]), "65 dimensions"),
        (proto(1, [2, 16383], tensor_content=b"\0" * 12), "tensor_content has 12 bytes"),
        (proto(1, [1, 16383], tensor_content=b"\0" * (4 * 16383 + 1)), "needs 65532"),
        (proto(1, [1, 16383], float_val=[1.0] * 16384), "16384 values for a shape of 16383"),
    ],
    ids=["zero-and-huge", "negative", "65-dims", "short-content", "long-content", "too-many"],
)
def test_odd_shapes_are_invalid_arguments(stub, tensor, message) -> None:
    error = rpc_error(stub, request("wide", x=tensor))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert message in error.details()


# -- types -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"x": np.array([1, 2], np.int32)}, "Expects arg[1] to be float but int32 is provided"),
        ({"x": np.array([1, 2], np.float64)}, "Expects arg[1] to be float but double is provided"),
        ({"ids": np.array([1, 2], np.int32)}, "Expects arg[0] to be int64 but int32 is provided"),
        ({"ids": np.array([1, 0], np.bool_)}, "Expects arg[0] to be int64 but bool is provided"),
    ],
)
def test_a_tensor_of_another_type_is_refused_as_tensorflow_serving_does(
    stub, inputs, message
) -> None:
    sent = {"x": np.array([1, 2], np.float32), "ids": np.array([3, 4], np.int64)} | inputs
    protos = {name: numpy_to_tensor_proto(array) for name, array in sent.items()}
    error = rpc_error(stub, request("pair", **protos))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith(message)


def test_the_right_types_run(stub) -> None:
    protos = {
        "x": numpy_to_tensor_proto(np.array([1, 2], np.float32)),
        "ids": proto(9, [2], int64_val=[3, 4]),
    }
    response = stub.Predict(request("pair", **protos), timeout=60)
    assert tf.make_ndarray(response.outputs["y"]).tolist() == [4.0, 6.0]


def test_a_scalar_proto_of_the_right_type_runs(stub) -> None:
    response = stub.Predict(request("half", x=proto(1, [], float_val=[3.0])), timeout=60)
    assert tf.make_ndarray(response.outputs["y"]).tolist() == 3.5
    error = rpc_error(stub, request("half", x=proto(3, [], int_val=[3])))
    assert error.details().startswith("Expects arg[0] to be float but int32 is provided")


# -- REST --------------------------------------------------------------------------------


def test_rest_scalars_work(server) -> None:
    assert post(server, "/v1/models/half:predict", {"inputs": 3.0}) == (200, {"outputs": 3.5})
    assert post(server, "/v1/models/half:predict", {"inputs": {"x": 3}}) == (
        200,
        {"outputs": 3.5},
    )
    body = {"inputs": {"b64": base64.b64encode(b"\x00\x01\x02").decode()}}
    assert post(server, "/v1/models/length:predict", body) == (200, {"outputs": 3})


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/models/half:predict", {"inputs": True}, "expected numbers, got True"),
        ("/v1/models/pair:predict", {"inputs": {"x": [1.0, True], "ids": [1, 2]}}, "got True"),
        ("/v1/models/pair:predict", {"inputs": {"x": [1.0, 2.0], "ids": [10, 10.0]}}, "expected integers, got 10.0"),
        ("/v1/models/pair:predict", {"instances": [{"x": 1.0, "ids": 1.5}]}, "expected integers, got 1.5"),
        ("/v1/models/pair:predict", {"instances": [{"x": 1.0, "ids": True}]}, "expected integers, got True"),
    ],
)  # fmt: skip
def test_rest_values_the_input_type_does_not_take_are_400(server, path, body, message) -> None:
    status, answer = post(server, path, body)
    assert status == 400 and message in answer["error"], answer


def test_rest_numbers_are_converted_as_tensorflow_serving_converts_them(server) -> None:
    body = {"inputs": {"x": [1e300, 2**25 + 1], "ids": [0, 0]}}
    status, answer = post(server, "/v1/models/pair:predict", body)
    assert status == 200 and answer["outputs"] == [float("inf"), float(np.float32(2**25 + 1))]


# -- answers of a scalar model -----------------------------------------------------------


def test_a_scalar_output_is_neither_a_classification_nor_a_regression() -> None:
    with pytest.raises(FailedPrecondition, match="is a scalar"):
        top_classes({"y": np.float32(3.5)}, None)
    with pytest.raises(FailedPrecondition):
        values_from_outputs({"y": np.float32(3.5)}, None, None)
