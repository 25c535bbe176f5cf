"""Property-based fuzzing of both APIs: whatever a client sends, the gateway answers OK or
INVALID_ARGUMENT / 400, never crashes, and never lets a bad request spoil a batch that
good requests share."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorflow.core.framework.tensor_pb2 import TensorProto
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving.config import GatewayConfig
from serving.tensors import numpy_to_tensor_proto, tensor_proto_to_numpy
from tests.support.gateways import GatewayThread
from tests.support.serving_models import ServingModel, sample_inputs

pytestmark = pytest.mark.timeout(180)

FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ACCEPTABLE = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, serving_model: ServingModel
) -> Iterator[GatewayThread]:
    root: Path = tmp_path_factory.mktemp("fuzz") / "models"
    serving_model.publish(root, 1)
    config = GatewayConfig.model_validate({"batching": {"batch_timeout_micros": 3000}})
    with GatewayThread(root, config) as thread:
        yield thread


@pytest.fixture(scope="module")
def stub(server: GatewayThread) -> Iterator[prediction_service_pb2_grpc.PredictionServiceStub]:
    with grpc.insecure_channel(server.grpc_target) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="module")
def good_traffic(server, stub, serving_model: ServingModel) -> Iterator[list[str]]:
    """Valid requests sent all through the fuzzing; each must get the right answer."""
    inputs = sample_inputs(2, seed=11)
    expected = serving_model.keras_outputs(inputs)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "digits"
    for name, array in inputs.items():
        request.inputs[name].CopyFrom(numpy_to_tensor_proto(array))
    problems: list[str] = []
    stop = threading.Event()

    def loop() -> None:
        deadline = time.monotonic() + 150
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                response = stub.Predict(request, timeout=10)
                got = tensor_proto_to_numpy(response.outputs["label"])
                if not np.allclose(got, expected["label"], rtol=1e-5, atol=1e-6):
                    problems.append("a good request got a wrong answer")
            except grpc.RpcError as exc:
                problems.append(f"a good request failed: {exc.code()} {exc.details()}")

    thread = threading.Thread(target=loop)
    thread.start()
    yield problems
    stop.set()
    thread.join(30)


# -- gRPC ----------------------------------------------------------------------------------

DTYPES = st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 14, 19, 20, 21, 101, 999])
DIMS = st.lists(st.integers(min_value=-2, max_value=9), max_size=5)


@st.composite
def tensor_protos(draw: st.DrawFn) -> TensorProto:
    proto = TensorProto(dtype=draw(DTYPES))
    dims = draw(DIMS)
    for size in dims:
        proto.tensor_shape.dim.add(size=size)
    proto.tensor_shape.unknown_rank = draw(st.booleans()) and draw(st.booleans())
    choice = draw(st.sampled_from(["content", "float", "int", "int64", "string", "bool", "none"]))
    if choice == "content":
        proto.tensor_content = draw(st.binary(max_size=2048))
    elif choice == "float":
        proto.float_val.extend(draw(st.lists(st.floats(width=32), max_size=300)))
    elif choice == "int":
        proto.int_val.extend(draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=300)))
    elif choice == "int64":
        proto.int64_val.extend(draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50)))
    elif choice == "string":
        proto.string_val.extend(draw(st.lists(st.binary(max_size=20), max_size=20)))
    elif choice == "bool":
        proto.bool_val.extend(draw(st.lists(st.booleans(), max_size=50)))
    return proto


def valid_proto(name: str) -> TensorProto:
    return numpy_to_tensor_proto(sample_inputs(1)[name])


@st.composite
def predict_requests(draw: st.DrawFn) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "digits"
    names = draw(
        st.lists(
            st.sampled_from(["image", "extra", "other", ""]), min_size=0, max_size=3, unique=True
        )
    )
    for name in names:
        proto = draw(
            st.one_of(
                tensor_protos(),
                st.just(valid_proto(name)) if name in ("image", "extra") else tensor_protos(),
            )
        )
        request.inputs[name].CopyFrom(proto)
    request.output_filter.extend(
        draw(st.lists(st.sampled_from(["label", "value", "nope"]), max_size=2, unique=True))
    )
    return request


@FUZZ
@given(request=predict_requests())
def test_random_tensor_protos_never_crash_the_grpc_api(stub, good_traffic, request) -> None:
    try:
        stub.Predict(request, timeout=10)
        code = grpc.StatusCode.OK
    except grpc.RpcError as exc:
        code = exc.code()
        assert exc.details(), "errors must say what was wrong"
    assert code in ACCEPTABLE
    assert good_traffic == []


# -- REST ------------------------------------------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.fixed_dictionaries({"b64": st.sampled_from(["AAEC", "not base64!", ""])}),
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=6)
        | st.dictionaries(st.sampled_from(["image", "extra", "b64", "x"]), children, max_size=3)
    ),
    max_leaves=40,
)
BODIES = st.one_of(
    st.fixed_dictionaries({"instances": JSON_VALUES}),
    st.fixed_dictionaries({"inputs": JSON_VALUES}),
    st.fixed_dictionaries(
        {
            "instances": st.lists(
                st.fixed_dictionaries({"image": JSON_VALUES, "extra": JSON_VALUES}), max_size=3
            )
        }
    ),
    st.fixed_dictionaries({"signature_name": JSON_VALUES, "inputs": JSON_VALUES}),
    JSON_VALUES,
)
RAW = st.one_of(
    BODIES.map(lambda body: json.dumps(body).encode()),
    st.binary(max_size=200),
)


def post(server: GatewayThread, path: str, data: bytes) -> tuple[int, Any]:
    request = urllib.request.Request(server.rest_url + path, data=data, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@FUZZ
@given(data=RAW, verb=st.sampled_from(["predict", "classify", "regress"]))
def test_random_json_never_crashes_the_rest_api(server, good_traffic, data, verb) -> None:
    status, body = post(server, f"/v1/models/digits:{verb}", data)
    # A signature the body names that the model does not have is a 400 too.
    assert status in (200, 400), body
    if status == 400:
        assert body["error"]
    assert good_traffic == []


def test_the_gateway_still_answers_correctly_after_the_fuzzing(
    server, stub, good_traffic, serving_model: ServingModel
) -> None:
    inputs = sample_inputs(3, seed=2)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "digits"
    for name, array in inputs.items():
        request.inputs[name].CopyFrom(numpy_to_tensor_proto(array))
    response = stub.Predict(request, timeout=10)
    expected = serving_model.keras_outputs(inputs)
    np.testing.assert_allclose(
        tensor_proto_to_numpy(response.outputs["label"]), expected["label"], rtol=1e-5
    )
    assert good_traffic == []
