"""Signatures, errors and tensor conversions: TensorProto both ways (packed and typed
fields, broadcast, malformed protos) and TensorFlow Serving's REST JSON formats."""

from __future__ import annotations

import json
import math

import grpc
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework.tensor_pb2 import TensorProto

from serving import errors
from serving.signature import STRING, Signature, TensorSpec, dtype_info
from serving.tensors import (
    MAX_TENSOR_BYTES,
    columnar_to_inputs,
    instances_to_inputs,
    json_to_inputs,
    numpy_to_tensor_proto,
    outputs_to_predictions,
    tensor_proto_to_numpy,
)
from tests.support.tensors import proto as _proto

NUMERIC = [
    np.float32,
    np.float64,
    np.float16,
    ml_dtypes.bfloat16,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.bool_,
    np.complex64,
    np.complex128,
]
SHAPES = [(), (0,), (3,), (2, 3), (0, 4), (2, 0, 3), (1, 2, 2, 1)]


def make_array(dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    values = np.arange(math.prod(shape)).reshape(shape)
    if dtype is np.bool_:
        return values % 2 == 1
    if np.dtype(dtype).kind == "c":
        return (values + 0.5j * values).astype(dtype)
    return values.astype(dtype)


def spec(name: str, dtype: object, shape: tuple[int | None, ...] | None) -> TensorSpec:
    return TensorSpec(name, np.dtype(dtype), shape)


# -- signature and errors ---------------------------------------------------------------


def test_dtype_table_agrees_with_tensorflow() -> None:
    for dtype in NUMERIC:
        info = dtype_info(np.dtype(dtype))
        assert tf.as_dtype(info.enum).name == info.name
        assert dtype_info(info.name) is info and dtype_info(info.enum) is info
    assert dtype_info("string").numpy is STRING
    assert dtype_info(np.dtype("S5")).name == dtype_info(np.dtype("<U3")).name == "string"
    with pytest.raises(ValueError, match="unsupported"):
        dtype_info(20)  # DT_RESOURCE


def test_signature_round_trips_through_json_and_signature_def() -> None:
    signature = Signature(
        "serving_default",
        {"image": spec("image", np.float32, (None, 8, 8, 1)), "tag": spec("tag", object, (None,))},
        {"label": spec("label", np.float32, (-1, 10)), "any": spec("any", np.int64, None)},
    )
    assert signature.outputs["label"].shape == (None, 10)
    assert signature.inputs["image"].describe() == "float32 [-1, 8, 8, 1]"
    assert Signature.from_json(signature.to_json()) == signature
    proto = signature.to_proto()
    assert proto.method_name == "tensorflow/serving/predict"
    assert [d.size for d in proto.inputs["image"].tensor_shape.dim] == [-1, 8, 8, 1]
    assert proto.outputs["any"].tensor_shape.unknown_rank
    assert Signature.from_proto("serving_default", proto) == signature
    with pytest.raises(ValueError, match="shape must be a list"):
        Signature.from_json({"inputs": {"x": {"dtype": "float32", "shape": "3"}}, "outputs": {}})


@pytest.mark.parametrize(
    ("cls", "code", "http"),
    [
        (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT, 400),
        (errors.NotFound, grpc.StatusCode.NOT_FOUND, 404),
        (errors.Unavailable, grpc.StatusCode.UNAVAILABLE, 503),
        (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
        (errors.DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED, 504),
        (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION, 400),
        (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED, 401),
        (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED, 403),
        (errors.Internal, grpc.StatusCode.INTERNAL, 500),
    ],
)
def test_each_error_knows_its_grpc_and_http_status(
    cls: type, code: grpc.StatusCode, http: int
) -> None:
    error = cls("boom")
    assert isinstance(error, errors.ServingError)
    assert (error.code, error.http_status, error.message, str(error)) == (
        code,
        http,
        "boom",
        "boom",
    )
    assert type(errors.ServingError.for_code(code, "relayed")) is cls


def test_tensorflow_errors_keep_their_status() -> None:
    error = errors.as_serving_error(tf.errors.InvalidArgumentError(None, None, "bad shape"))
    assert isinstance(error, errors.InvalidArgument) and error.message == "bad shape"
    fallback = errors.as_serving_error(RuntimeError("oops"), default=grpc.StatusCode.UNKNOWN)
    assert fallback.code is grpc.StatusCode.UNKNOWN and fallback.error_code == 2
    assert "RuntimeError: oops" in fallback.message


# -- TensorProto ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_numeric_round_trip(dtype: type, shape: tuple[int, ...]) -> None:
    array = make_array(dtype, shape)
    proto = numpy_to_tensor_proto(array)
    back = tensor_proto_to_numpy(proto)
    assert back.dtype == array.dtype and back.shape == shape
    np.testing.assert_array_equal(back, array)
    if dtype is not ml_dtypes.bfloat16:
        # TensorFlow reads what we write, and we read what TensorFlow writes.
        np.testing.assert_array_equal(tf.make_ndarray(proto), array)
        np.testing.assert_array_equal(tensor_proto_to_numpy(tf.make_tensor_proto(array)), array)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_string_round_trip(shape: tuple[int, ...]) -> None:
    array = np.empty(shape, dtype=object)
    array.reshape(-1)[:] = [
        b"\x00\xffbin" if i % 2 else f"s{i}".encode() for i in range(array.size)
    ]
    proto = numpy_to_tensor_proto(array)
    assert not proto.tensor_content and len(proto.string_val) == array.size
    back = tensor_proto_to_numpy(proto)
    assert back.dtype == object and back.shape == shape
    assert back.tolist() == array.tolist()
    assert tf.make_ndarray(proto).tolist() == array.tolist()


def test_str_and_fixed_width_strings_are_sent_as_utf8() -> None:
    proto = numpy_to_tensor_proto(np.array(["héllo", "b"]))
    assert list(proto.string_val) == ["héllo".encode(), b"b"]
    assert list(numpy_to_tensor_proto(np.array([b"ab", b"c"])).string_val) == [b"ab", b"c"]


def test_typed_fields_broadcast_their_last_value_like_tensorflow() -> None:
    proto = TensorProto(dtype=1)
    for size in (2, 3):
        proto.tensor_shape.dim.add(size=size)
    proto.float_val.extend([1.5, 2.5])
    np.testing.assert_array_equal(
        tensor_proto_to_numpy(proto), np.array([[1.5, 2.5, 2.5], [2.5, 2.5, 2.5]], np.float32)
    )
    empty = TensorProto(dtype=9)
    empty.tensor_shape.dim.add(size=4)
    np.testing.assert_array_equal(tensor_proto_to_numpy(empty), np.zeros(4, np.int64))
    strings = TensorProto(dtype=7)
    strings.tensor_shape.dim.add(size=3)
    strings.string_val.append(b"x")
    assert tensor_proto_to_numpy(strings).tolist() == [b"x", b"x", b"x"]
    assert tf.make_ndarray(proto).tolist() == tensor_proto_to_numpy(proto).tolist()


def test_half_and_complex_typed_fields() -> None:
    half = TensorProto(dtype=19)
    half.tensor_shape.dim.add(size=2)
    half.half_val.extend(int(v) for v in np.array([1.5, -2], np.float16).view(np.uint16))
    np.testing.assert_array_equal(tensor_proto_to_numpy(half), np.array([1.5, -2], np.float16))
    bf16 = TensorProto(dtype=14)
    bf16.tensor_shape.dim.add(size=1)
    bf16.half_val.append(int(np.array([3.0], ml_dtypes.bfloat16).view(np.uint16)[0]))
    assert tensor_proto_to_numpy(bf16).tolist() == [3.0]
    complex_proto = TensorProto(dtype=8)
    complex_proto.tensor_shape.dim.add(size=2)
    complex_proto.scomplex_val.extend([1, 2, 3, 4])
    np.testing.assert_array_equal(tensor_proto_to_numpy(complex_proto), [1 + 2j, 3 + 4j])
    int8 = TensorProto(dtype=6)
    int8.tensor_shape.dim.add(size=2)
    int8.int_val.extend([-128, 127])
    assert tensor_proto_to_numpy(int8).dtype == np.int8


def test_packed_content_is_not_copied() -> None:
    array = tensor_proto_to_numpy(numpy_to_tensor_proto(np.ones((64, 64), np.float32)))
    assert not array.flags.writeable and not array.flags.owndata


@pytest.mark.parametrize(
    ("proto", "message"),
    [
        (_proto(1, [2, 3], tensor_content=b"\x00" * 20), "tensor_content has 20 bytes but shape [2, 3] float32 needs 24"),
        (_proto(1, [2, -1]), "negative dimension in shape [2, -1]"),
        (_proto(20, [1]), "unsupported dtype DT_RESOURCE"),
        (_proto(0, [1]), "unsupported dtype DT_INVALID"),
        (_proto(1, [1], float_val=[1.0, 2.0]), "2 values for a shape of 1 elements"),
        (_proto(7, [1], tensor_content=b"ab"), "string tensors cannot use tensor_content"),
        (_proto(6, [1], int_val=[300]), "value out of range for int8"),
        (_proto(8, [1], scomplex_val=[1.0]), "(real, imaginary) pairs"),
        (_proto(1, [1 << 20, 1 << 20], float_val=[1.0]), f"larger than {MAX_TENSOR_BYTES} bytes"),
    ],
    ids=["content-length", "negative-dim", "resource", "invalid", "too-many", "string-content",
         "int8-range", "complex-odd", "huge-broadcast"],
)  # fmt: skip
def test_malformed_protos_are_refused_naming_the_input(proto: TensorProto, message: str) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        tensor_proto_to_numpy(proto, "image")
    assert caught.value.message.startswith("input 'image': ")
    assert message in caught.value.message


def test_unknown_rank_is_refused() -> None:
    proto = TensorProto(dtype=1)
    proto.tensor_shape.unknown_rank = True
    with pytest.raises(errors.InvalidArgument, match="input 'x': the shape must be known"):
        tensor_proto_to_numpy(proto, "x")


# -- JSON: TensorFlow Serving's REST API ------------------------------------------------

DOC_SIGNATURE = Signature(
    "serving_default",
    {
        "tag": spec("tag", object, (None,)),
        "signal": spec("signal", np.int64, (None, 5)),
        "sensor": spec("sensor", np.float32, (None, 2, 2)),
    },
    {},
)
ONE_FLOAT = Signature("s", {"x": spec("x", np.float32, (None,))}, {})


def test_documented_row_and_columnar_requests_give_the_same_tensors() -> None:
    rows = json.loads(
        '{"instances": [{"tag": "foo", "signal": [1, 2, 3, 4, 5], "sensor": [[1, 2], [3, 4]]},'
        ' {"tag": "bar", "signal": [3, 4, 1, 2, 5], "sensor": [[4, 5], [6, 8]]}]}'
    )
    columns = json.loads(
        '{"inputs": {"tag": ["foo", "bar"], "signal": [[1, 2, 3, 4, 5], [3, 4, 1, 2, 5]],'
        ' "sensor": [[[1, 2], [3, 4]], [[4, 5], [6, 8]]]}}'
    )
    from_rows, row_format = json_to_inputs(rows, DOC_SIGNATURE)
    from_columns, columnar_format = json_to_inputs(columns, DOC_SIGNATURE)
    assert row_format and not columnar_format
    assert from_rows["tag"].tolist() == [b"foo", b"bar"]
    assert from_rows["signal"].dtype == np.int64 and from_rows["signal"].shape == (2, 5)
    assert from_rows["sensor"].dtype == np.float32 and from_rows["sensor"].shape == (2, 2, 2)
    for name in from_rows:
        np.testing.assert_array_equal(from_rows[name], from_columns[name])


def test_single_input_rows_may_be_bare_values() -> None:
    strings = Signature("s", {"text": spec("text", object, (None,))}, {})
    assert instances_to_inputs(["foo", "bar", "baz"], strings)["text"].tolist() == [
        b"foo",
        b"bar",
        b"baz",
    ]
    pairs = Signature("s", {"x": spec("x", np.int32, (None, 1, 2))}, {})
    batch = instances_to_inputs([[[1, 2]], [[3, 4]]], pairs)["x"]
    assert batch.dtype == np.int32 and batch.tolist() == [[[1, 2]], [[3, 4]]]
    named = instances_to_inputs([{"x": 1.0}, {"x": 2}], ONE_FLOAT)["x"]
    assert named.tolist() == [1.0, 2.0]
    assert columnar_to_inputs([1.0, 2.0, 5.0], ONE_FLOAT)["x"].dtype == np.float32


def test_b64_objects_carry_binary_strings() -> None:
    images = Signature("s", {"image": spec("image", object, (None,))}, {})
    body = {"instances": [{"b64": "aW1hZ2UgYnl0ZXM="}, {"b64": "YXdlc29tZSBpbWFnZSBieXRlcw=="}]}
    inputs, _ = json_to_inputs(body, images)
    assert inputs["image"].tolist() == [b"image bytes", b"awesome image bytes"]
    columnar, _ = json_to_inputs({"inputs": {"b64": "AP8="}}, images)
    assert columnar["image"].shape == () and columnar["image"].item() == b"\x00\xff"


def test_half_plus_three_example_round_trip() -> None:
    inputs, row_format = json_to_inputs({"instances": [1.0, 2.0, 5.0]}, ONE_FLOAT)
    outputs = {"y": inputs["x"] * 0.5 + 3}
    assert outputs_to_predictions(outputs, row_format) == {"predictions": [3.5, 4.0, 5.5]}
    assert outputs_to_predictions(outputs, False) == {"outputs": [3.5, 4.0, 5.5]}


def test_outputs_follow_the_request_format() -> None:
    outputs = {
        "scores": np.array([[0.5, 0.25], [1.0, -2.0]], np.float32),
        "image_bytes": np.array([b"\x00\x01", b"\xff"], dtype=object),
        "caption": np.array([b"sea", b"\xfe\xff"], dtype=object),
    }
    assert outputs_to_predictions(outputs, True) == {
        "predictions": [
            {"scores": [0.5, 0.25], "image_bytes": {"b64": "AAE="}, "caption": "sea"},
            {"scores": [1.0, -2.0], "image_bytes": {"b64": "/w=="}, "caption": {"b64": "/v8="}},
        ]
    }
    columnar = outputs_to_predictions(outputs, False)
    assert columnar["outputs"]["scores"] == [[0.5, 0.25], [1.0, -2.0]]
    assert columnar["outputs"]["image_bytes"] == [{"b64": "AAE="}, {"b64": "/w=="}]
    special = outputs_to_predictions({"x": np.array([np.nan, np.inf], np.float32)}, False)
    assert json.dumps(special) == '{"outputs": [NaN, Infinity]}'
    assert outputs_to_predictions({"x": np.zeros((0, 2))}, True) == {"predictions": []}


def test_json_outputs_read_back_as_the_same_inputs() -> None:
    tensors = {
        "tag": np.array([b"foo", b"bar"], dtype=object),
        "signal": np.arange(10, dtype=np.int64).reshape(2, 5),
        "sensor": np.linspace(0, 1, 8, dtype=np.float32).reshape(2, 2, 2),
    }
    for row_format in (True, False):
        body = json.loads(json.dumps(outputs_to_predictions(tensors, row_format)))
        request = {"instances": body["predictions"]} if row_format else {"inputs": body["outputs"]}
        back, _ = json_to_inputs(request, DOC_SIGNATURE)
        for name, array in tensors.items():
            assert back[name].tolist() == array.tolist()


@pytest.mark.parametrize(
    ("body", "signature", "message"),
    [
        ({"instances": [1], "inputs": [1]}, ONE_FLOAT, "either 'instances' or 'inputs', not both"),
        ({"signature_name": "s"}, ONE_FLOAT, "missing 'inputs' or 'instances' key"),
        ({"instances": []}, ONE_FLOAT, "'instances' is empty"),
        ({"instances": {"x": 1}}, ONE_FLOAT, "'instances' must be a list"),
        ({"instances": [[1, 2, 3, 4, 5]]}, DOC_SIGNATURE, "the signature has several inputs (tag, signal, sensor)"),
        ({"instances": [{"tag": "a", "signal": [1, 2, 3, 4, 5]}]}, DOC_SIGNATURE, "instances[0]: expected keys ['sensor', 'signal', 'tag'], got ['signal', 'tag']"),
        ({"instances": [{"x": 1}, 2]}, ONE_FLOAT, "instances[1]: expected an object keyed by input name"),
        ({"instances": [[1, 2], [3]]}, Signature("s", {"x": spec("x", np.float32, (None, None))}, {}), "input 'x': instances give it different shapes"),
        ({"inputs": [[1, 2], [3]]}, Signature("s", {"x": spec("x", np.float32, (None, None))}, {}), "input 'x': lists at the same level differ in length"),
        ({"instances": ["a"]}, ONE_FLOAT, "input 'x': expected numbers, got 'a'"),
        ({"instances": [True]}, ONE_FLOAT, "input 'x': expected numbers, got True"),
        ({"instances": [None]}, ONE_FLOAT, "input 'x': expected numbers, got None"),
        ({"instances": [1.5]}, Signature("s", {"x": spec("x", np.int32, (None,))}, {}), "input 'x': expected integers, got 1.5"),
        ({"instances": [300]}, Signature("s", {"x": spec("x", np.uint8, (None,))}, {}), "input 'x': value out of range for uint8"),
        ({"instances": [2**70]}, Signature("s", {"x": spec("x", np.int64, (None,))}, {}), "input 'x': value out of range for 64-bit integers"),
        ({"instances": [1]}, Signature("s", {"x": spec("x", np.bool_, (None,))}, {}), "input 'x': expected bools, got 1"),
        ({"instances": [{"b64": "not base64!"}]}, Signature("s", {"x": spec("x", object, (None,))}, {}), "input 'x': {'b64': ...} is not valid base64"),
        ({"instances": [1]}, Signature("s", {"x": spec("x", object, (None,))}, {}), "expected strings or {'b64': ...} objects, got 1"),
        ({"inputs": {"x": [1], "y": [2]}}, ONE_FLOAT, "unknown input 'y'; the signature takes x"),
        ({"inputs": {"tag": ["a"]}}, DOC_SIGNATURE, "missing input 'signal' in 'inputs'"),
        ({"inputs": [1 + 1j]}, Signature("s", {"x": spec("x", np.complex64, (None,))}, {}), "complex64 tensors cannot be sent as JSON"),
    ],
)  # fmt: skip
def test_bad_json_requests_explain_themselves(
    body: dict, signature: Signature, message: str
) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        json_to_inputs(body, signature)
    assert message in caught.value.message


def test_huge_unsigned_values_stay_exact() -> None:
    unsigned = Signature("s", {"x": spec("x", np.uint64, (None,))}, {})
    values = [2**64 - 1, 1]
    assert instances_to_inputs(values, unsigned)["x"].tolist() == values


def test_row_format_outputs_need_one_batch_size() -> None:
    with pytest.raises(errors.InvalidArgument, match="outputs disagree on batch size"):
        outputs_to_predictions({"a": np.zeros(2), "b": np.zeros(3)}, True)
    with pytest.raises(errors.InvalidArgument, match="output 'a' is a scalar"):
        outputs_to_predictions({"a": np.float32(1)}, True)
    assert outputs_to_predictions({"a": np.zeros(2), "b": np.zeros(3)}, False) == {
        "outputs": {"a": [0.0, 0.0], "b": [0.0, 0.0, 0.0]}
    }
