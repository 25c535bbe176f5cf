"""REST answers as TensorFlow Serving writes them (``json_tensor.cc``,
``http_rest_api_handler.cc``): float32 numbers at float32 precision, classes without a
``classes`` output have a score and no label (gRPC too), and metadata prints every field."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import classification_pb2, predict_pb2, prediction_service_pb2_grpc

from serving.inference_results import classes_from_outputs, classification_proto, top_classes
from serving.tensors import float32_json_value, outputs_to_predictions
from tests.support.gateways import GatewayThread
from tests.support.http import http
from tests.support.waiting import wait_until
from tests.support.warmup import example, write_half_plus_two

pytestmark = pytest.mark.timeout(120)

MODEL = "half_plus_two"
UNBATCHED = "two_lengths"


def write_two_lengths(directory: Path) -> None:
    """A model whose two inputs have lengths of their own (TF Serving's columnar format
    lets them differ): the sum of one, the other doubled."""

    class TwoLengths(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None], tf.float32, name="a"),
                tf.TensorSpec([None], tf.float32, name="b"),
            ]
        )
        def serve(self, a: tf.Tensor, b: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"sum_a": tf.reduce_sum(a), "b_doubled": 2.0 * b}

    module = TwoLengths()
    tf.saved_model.save(module, str(directory), signatures={"serving_default": module.serve})


def as_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


# -- numbers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (2.1, "2.1"),  # not 2.0999999046325684, the float64 widening of float32 2.1
        (0.2, "0.2"),
        (1.0, "1.0"),
        (-0.5, "-0.5"),
        (100000.0, "100000.0"),
        (1e-05, "1e-05"),
        (0.1234567, "0.123456702"),  # six digits do not read back: nine, as TF Serving
        (3.4028234663852886e38, "3.40282347e+38"),
        (math.inf, "Infinity"),
        (-math.inf, "-Infinity"),
    ],
)
def test_float32_numbers_print_as_tf_serving_writes_them(value: float, text: str) -> None:
    written = float32_json_value(float(np.float32(value)))
    # the number TF Serving's text stands for, which reads back as the same float32
    assert written == json.loads(text)
    assert np.float32(written) == np.float32(value)
    assert json.loads(json.dumps(written)) == written


def test_json_tensor_test_six_digit_precision_case() -> None:
    # json_tensor_test.cc FromJsonSingleFloatTensorSixDigitPrecision and ...NonFinite
    values = np.array([[9000000, 999999, 0.5], [0.0003, 0.00003, 555557.5]], np.float32)
    expected = json.loads("[[9e+06, 999999.0, 0.5], [0.0003, 3e-05, 555557.5]]")
    assert outputs_to_predictions({"float_tensor": values}, True) == {"predictions": expected}
    special = np.array([[np.nan, np.inf], [3, -np.inf]], np.float32)
    text = json.dumps(outputs_to_predictions({"float_tensor": special}, True))
    assert text == '{"predictions": [[NaN, Infinity], [3.0, -Infinity]]}'


def test_outputs_in_both_formats_use_float32_precision() -> None:
    outputs = {"y": np.array([[2.1], [0.2]], np.float32)}
    assert as_json(outputs_to_predictions(outputs, False)) == '{"outputs":[[2.1],[0.2]]}'
    assert as_json(outputs_to_predictions(outputs, True)) == '{"predictions":[[2.1],[0.2]]}'
    scalar = {"y": np.float32(2.1)}
    assert as_json(outputs_to_predictions(scalar, False)) == '{"outputs":2.1}'
    assert json.dumps(outputs_to_predictions({"y": np.array([np.nan], np.float32)}, False)) == (
        '{"outputs": [NaN]}'
    )
    # float64 keeps its own precision; integers stay integers
    wide = {"y": np.array([0.1], np.float64), "n": np.array([3], np.int64)}
    assert as_json(outputs_to_predictions(wide, False)) == '{"outputs":{"y":[0.1],"n":[3]}}'


# -- classify without a classes output ---------------------------------------------------


def test_classes_without_names_have_a_score_and_no_label() -> None:
    outputs = {"scores": np.array([[0.25, 0.75]], np.float32)}
    answer = classes_from_outputs(outputs, None, 1)
    assert answer == [[("", 0.25), ("", 0.75)]]
    proto = classification_proto(answer)
    assert [(c.label, c.score) for c in proto.classifications[0].classes] == [
        ("", 0.25),
        ("", 0.75),
    ]
    # feedback still knows an unnamed class by its index
    assert top_classes(outputs, None) == (2, [(1, "1")])


# -- through the gateway -----------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    root = tmp_path_factory.mktemp("fidelity") / "models"
    write_half_plus_two(root / MODEL / "1")
    write_two_lengths(root / UNBATCHED / "1")
    with GatewayThread(root) as thread:
        for name in (MODEL, UNBATCHED):
            wait_until(
                lambda name=name: http(thread, "GET", f"/v1/models/{name}")[0] == 200,
                f"{name} to load",
                timeout=60,
            )
        yield thread


def test_a_tf_example_model_without_warmup_file_serves(server: GatewayThread) -> None:
    status, body = http(server, "GET", f"/v1/models/{MODEL}")
    assert status == 200
    assert body["model_version_status"][0]["state"] == "AVAILABLE"


def test_rest_predict_and_regress_print_float32_values(server: GatewayThread) -> None:
    status, body = http(
        server,
        "POST",
        f"/v1/models/{MODEL}:regress",
        {"signature_name": "regress_x_to_y", "examples": [{"x": 0.2}, {"x": 1.0}]},
    )
    assert (status, body) == (200, {"results": [2.1, 2.5]})
    serialized = base64.b64encode(example(0.2).SerializeToString()).decode()
    status, body = http(
        server, "POST", f"/v1/models/{MODEL}:predict", {"instances": [{"b64": serialized}]}
    )
    assert (status, body) == (200, {"predictions": [[2.1]]})


def test_rest_classify_without_classes_output_has_empty_labels(server: GatewayThread) -> None:
    status, body = http(
        server,
        "POST",
        f"/v1/models/{MODEL}:classify",
        {"signature_name": "classify_x_to_y", "examples": [{"x": 0.2}]},
    )
    assert (status, body) == (200, {"results": [[["", 0.2], ["", 2.1]]]})


def test_grpc_classify_without_classes_output_sets_scores_only(server: GatewayThread) -> None:
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = MODEL
    request.model_spec.signature_name = "classify_x_to_y"
    request.input.example_list.examples.append(example(1.0))
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Classify(request, timeout=30)
    [classifications] = response.result.classifications
    assert [(c.label, c.score) for c in classifications.classes] == [("", 1.0), ("", 2.5)]


def test_columnar_inputs_need_not_share_their_first_dimension(server: GatewayThread) -> None:
    body = {"inputs": {"a": [1.0, 2.0, 3.0], "b": [5.0]}}
    status, answer = http(server, "POST", f"/v1/models/{UNBATCHED}:predict", body)
    assert (status, answer) == (200, {"outputs": {"sum_a": 6.0, "b_doubled": [10.0]}})
    request = predict_pb2.PredictRequest()
    request.model_spec.name = UNBATCHED
    request.inputs["a"].CopyFrom(tf.make_tensor_proto(np.array([1.0, 2.0], np.float32)))
    request.inputs["b"].CopyFrom(tf.make_tensor_proto(np.array([4.0, 5.0, 6.0], np.float32)))
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(request, timeout=30)
    assert tf.make_ndarray(response.outputs["sum_a"]) == 3.0
    assert tf.make_ndarray(response.outputs["b_doubled"]).tolist() == [8.0, 10.0, 12.0]


def test_metadata_prints_default_fields_as_tf_serving(server: GatewayThread) -> None:
    status, body = http(server, "GET", f"/v1/models/{MODEL}/versions/1/metadata")
    assert status == 200
    assert body["model_spec"] == {"name": MODEL, "signature_name": "", "version": "1"}
    signatures = body["metadata"]["signature_def"]["signature_def"]
    assert {"serving_default", "regress_x_to_y", "classify_x_to_y"} <= set(signatures)
    signature = signatures["serving_default"]
    assert signature["inputs"]["inputs"] == {
        "dtype": "DT_STRING",
        "tensor_shape": {"dim": [{"size": "-1", "name": ""}], "unknown_rank": False},
        "name": "serving_default_inputs:0",
    }
    assert signature["outputs"]["outputs"]["tensor_shape"] == {
        "dim": [{"size": "-1", "name": ""}, {"size": "1", "name": ""}],
        "unknown_rank": False,
    }
    assert signature["method_name"] == "tensorflow/serving/predict"
