"""Request tensors that declare more than they send, odd shapes, and JSON numbers typed
by the signature as TensorFlow Serving types them."""

from __future__ import annotations

import contextlib
import math
import tracemalloc

import numpy as np
import pytest
from tensorflow.core.framework.tensor_pb2 import TensorProto

from serving.errors import InvalidArgument
from serving.signature import Signature, TensorSpec
from serving.tensors import (
    MAX_TENSOR_BYTES,
    columnar_to_inputs,
    instances_to_inputs,
    json_to_inputs,
    protos_to_inputs,
    tensor_proto_to_numpy,
)
from serving.validation import validate_inputs
from tests.support.tensors import proto


def signature(**specs: tuple[object, tuple[int | None, ...] | None]) -> Signature:
    return Signature(
        "serving_default",
        {name: TensorSpec(name, np.dtype(dtype), shape) for name, (dtype, shape) in specs.items()},
        {},
    )


def refused(call, *args, **kwargs) -> str:
    with pytest.raises(InvalidArgument) as caught:
        call(*args, **kwargs)
    return caught.value.message


def peak_bytes(call, *args, **kwargs) -> int:
    tracemalloc.start()
    try:
        with contextlib.suppress(InvalidArgument):
            call(*args, **kwargs)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_cap_is_the_default_message_size() -> None:
    from serving.config import DEFAULT_MAX_MESSAGE_BYTES

    assert MAX_TENSOR_BYTES == DEFAULT_MAX_MESSAGE_BYTES


# -- a few bytes that declare a huge tensor ----------------------------------------------

HUGE = [
    proto(1, [16384, 16383], float_val=[1.0]),
    proto(1, [16384, 16383], float_val=[1.0, 2.0, 3.0]),
    proto(9, [4096, 4096, 64], int64_val=[7]),
    proto(7, [1 << 22, 1 << 10], string_val=[b"x"]),
    proto(10, [1 << 40], bool_val=[]),
    proto(2, [1 << 20, 1 << 20]),
]


@pytest.mark.parametrize(
    "tensor", HUGE, ids=["float", "float3", "int64", "string", "bool", "empty"]
)
def test_a_huge_declared_shape_is_refused_without_allocating(tensor: TensorProto) -> None:
    assert tensor.ByteSize() < 100
    wide = signature(x=(np.float32, (None, 16383)))
    # Against a signature: the shape or type is judged first.
    assert peak_bytes(protos_to_inputs, {"x": tensor}, wide) < 1 << 20
    got = refused(protos_to_inputs, {"x": tensor}, wide)
    assert got.startswith(("input 'x': ", "Expects arg[0] to be float")), got
    # Without one (a decoder that does not know it), the size cap still holds.
    assert peak_bytes(tensor_proto_to_numpy, tensor, "x") < 1 << 20
    assert "is larger than 67108864 bytes" in refused(tensor_proto_to_numpy, tensor, "x")


def test_the_shape_is_checked_against_the_signature_before_the_size() -> None:
    tensor = proto(1, [16384, 16383], float_val=[1.0, 2.0])
    narrow = signature(x=(np.float32, (None, 784)))
    assert refused(protos_to_inputs, {"x": tensor}, narrow) == (
        "input 'x': expected float32 [-1, 784], got float32 [16384, 16383]"
    )
    # A shape the signature accepts is still capped by the message size.
    wide = signature(x=(np.float32, (None, 16383)))
    assert refused(protos_to_inputs, {"x": tensor}, wide) == (
        "input 'x': shape [16384, 16383] float32 is larger than 67108864 bytes, the largest "
        "message this server accepts; send fewer elements"
    )
    assert "larger than 1000 bytes" in refused(
        protos_to_inputs, {"x": proto(1, [1, 16383], float_val=[1.0, 2.0])}, wide, max_bytes=1000
    )


def test_one_repeated_value_costs_no_memory_until_it_fits_the_signature() -> None:
    tensor = proto(1, [2048, 4096], float_val=[0.5])  # 32 MiB once written out
    tracemalloc.start()
    try:
        array = tensor_proto_to_numpy(tensor, "x")
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()
    assert array.shape == (2048, 4096) and not array.flags.writeable
    assert float(array[2047, 4095]) == 0.5
    assert "expected float32 [-1, 784]" in refused(
        validate_inputs, {"x": array}, signature(x=(np.float32, (None, 784)))
    )
    checked = validate_inputs({"x": array}, signature(x=(np.float32, (None, 4096))))["x"]
    assert checked.flags.c_contiguous and checked.sum() == 2048 * 4096 * 0.5


def test_repeated_values_keep_tensorflows_rule() -> None:
    np.testing.assert_array_equal(
        tensor_proto_to_numpy(proto(3, [2, 3], int_val=[1, 2])), [[1, 2, 2], [2, 2, 2]]
    )
    assert tensor_proto_to_numpy(proto(9, [2, 2])).tolist() == [[0, 0], [0, 0]]
    assert tensor_proto_to_numpy(proto(7, [3], string_val=[b"a"])).tolist() == [b"a"] * 3
    assert tensor_proto_to_numpy(proto(7, [])).tolist() == b""
    assert tensor_proto_to_numpy(proto(1, [], float_val=[2.5])).tolist() == 2.5


# -- odd shapes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (proto(1, [0, 2**62]), "shape [0, 4611686018427387904] is too large"),
        (proto(1, [2**62, 0, 2**62]), "is too large"),
        (proto(1, [0, 2**62], tensor_content=b""), "is too large"),
        (proto(1, [3, -1], float_val=[1.0]), "negative dimension in shape [3, -1]"),
        (proto(1, [-(2**63)]), "negative dimension"),
        (proto(1, [1] * 65, float_val=[1.0]), "the shape has 65 dimensions; at most 64"),
        (proto(1, [1] * 300), "the shape has 300 dimensions"),
        (proto(1, [2, 3], tensor_content=b"\0" * 23), "tensor_content has 23 bytes but shape [2, 3] float32 needs 24"),
        (proto(9, [5], tensor_content=b"\0" * 41), "tensor_content has 41 bytes but shape [5] int64 needs 40"),
        (proto(1, [0], tensor_content=b"\0" * 4), "tensor_content has 4 bytes"),
        (proto(7, [1], tensor_content=b"ab"), "string tensors cannot use tensor_content"),
    ],
)  # fmt: skip
def test_odd_shapes_are_invalid_arguments(tensor: TensorProto, message: str) -> None:
    got = refused(tensor_proto_to_numpy, tensor, "x")
    assert got.startswith("input 'x': ") and message in got
    loose = signature(x=(np.float32, None))
    got = refused(protos_to_inputs, {"x": tensor}, loose)
    assert got.startswith(("input 'x': ", "Expects arg[0]")), got


def test_64_dimensions_still_work() -> None:
    assert tensor_proto_to_numpy(proto(1, [1] * 64, float_val=[3.0])).shape == (1,) * 64
    assert tensor_proto_to_numpy(proto(1, [0, 2**40])).shape == (0, 2**40)


# -- types, gRPC -------------------------------------------------------------------------


def test_a_proto_of_another_type_is_refused_as_tensorflow_serving_does() -> None:
    two = Signature(
        "serving_default",
        {
            "x": TensorSpec("x", np.dtype(np.float32), (None,), "serving_default_x:0"),
            "ids": TensorSpec("ids", np.dtype(np.int64), (None,), "serving_default_ids:0"),
        },
        {},
    )
    good = {"x": proto(1, [2], float_val=[1.0, 2.0]), "ids": proto(9, [2], int64_val=[1, 2])}
    assert protos_to_inputs(good, two)["x"].tolist() == [1.0, 2.0]
    cases = [
        ("x", proto(3, [2], int_val=[1, 2]), "Expects arg[1] to be float but int32 is provided"),
        ("x", proto(2, [2], double_val=[1.0, 2.0]), "Expects arg[1] to be float but double is provided"),
        ("x", proto(10, [2], bool_val=[True, False]), "Expects arg[1] to be float but bool is provided"),
        ("ids", proto(3, [2], int_val=[1, 2]), "Expects arg[0] to be int64 but int32 is provided"),
        ("ids", proto(1, [2], float_val=[1.0, 2.0]), "Expects arg[0] to be int64 but float is provided"),
    ]  # fmt: skip
    for name, tensor, message in cases:
        assert refused(protos_to_inputs, good | {name: tensor}, two).startswith(message + " (")
        decoded = {
            key: tensor_proto_to_numpy(value, key) for key, value in (good | {name: tensor}).items()
        }
        assert refused(validate_inputs, decoded, two).startswith(message)
    # Names first, as before.
    assert refused(protos_to_inputs, {"x": good["x"]}, two).startswith("missing input 'ids'")


# -- JSON --------------------------------------------------------------------------------

FLOAT = signature(x=(np.float32, (None,)))
DOUBLE = signature(x=(np.float64, (None,)))
INT64 = signature(x=(np.int64, (None,)))
INT32 = signature(x=(np.int32, (None,)))
BOOL = signature(x=(np.bool_, (None,)))


def test_json_integers_feed_float_inputs_with_tensorflow_servings_rounding() -> None:
    big = 2**25 + 1
    assert instances_to_inputs([big, 1], FLOAT)["x"].tolist() == [float(np.float32(big)), 1.0]
    assert instances_to_inputs([2**70, -(2**70)], DOUBLE)["x"].tolist() == [2.0**70, -(2.0**70)]
    assert instances_to_inputs([2**64 - 1, 0.5], FLOAT)["x"].dtype == np.float32
    assert instances_to_inputs([10**400, -(10**400)], DOUBLE)["x"].tolist() == [math.inf, -math.inf]


def test_json_floats_beyond_the_range_become_infinite() -> None:
    with np.errstate(over="raise"):
        got = instances_to_inputs([1e300, -1e300, 3.5], FLOAT)["x"]
    assert got.tolist() == [math.inf, -math.inf, 3.5] and got.dtype == np.float32
    half = signature(x=(np.float16, (None,)))
    assert instances_to_inputs([1e6, 70000], half)["x"].tolist() == [math.inf, math.inf]


@pytest.mark.parametrize(
    ("values", "sig", "message"),
    [
        ([True], FLOAT, "expected numbers, got True"),
        ([1.0, True], FLOAT, "expected numbers, got True"),
        ([[1.0], [False]], DOUBLE, "expected numbers, got False"),
        ([1, True], FLOAT, "expected numbers, got True"),
        ([10, 10.0], INT64, "expected integers, got 10.0"),
        ([10.0], INT64, "expected integers, got 10.0"),
        ([1, 2.5], INT32, "expected integers, got 2.5"),
        ([1, True], INT64, "expected integers, got True"),
        ([[1, 2], [3, False]], INT32, "expected integers, got False"),
        ([True, 1], BOOL, "expected bools, got 1"),
        ([True, 0.0], BOOL, "expected bools, got 0.0"),
        ([1, "2"], FLOAT, "expected numbers, got '2'"),
        ([1, {"b64": "AA=="}], FLOAT, "expected numbers, got {'b64': 'AA=='}"),
        ([2**31], INT32, "value out of range for int32"),
    ],
)  # fmt: skip
def test_json_values_the_signature_type_does_not_take_are_refused(
    values: list, sig: Signature, message: str
) -> None:
    assert refused(instances_to_inputs, values, sig) == f"input 'x': {message}"


def test_json_bools_and_integers_are_taken_as_they_are() -> None:
    assert instances_to_inputs([True, False], BOOL)["x"].tolist() == [True, False]
    assert instances_to_inputs([2**63 - 1, -1], INT64)["x"].tolist() == [2**63 - 1, -1]
    assert instances_to_inputs([[1, 2]], signature(x=(np.int8, (None, 2))))["x"].dtype == np.int8


def test_json_scalars_are_tensors_of_shape_nothing() -> None:
    scalar = signature(x=(np.float32, ()))
    inputs, row_format = json_to_inputs({"inputs": 3.0}, scalar)
    assert not row_format and inputs["x"].shape == () and inputs["x"].dtype == np.float32
    assert float(validate_inputs(inputs, scalar)["x"]) == 3.0
    assert columnar_to_inputs({"x": 3}, scalar)["x"].tolist() == 3.0
    assert refused(columnar_to_inputs, True, scalar) == "input 'x': expected numbers, got True"
    strings = signature(s=(object, ()))
    inputs, _ = json_to_inputs({"inputs": {"b64": "AAEC"}}, strings)
    assert inputs["s"].shape == () and inputs["s"].item() == b"\x00\x01\x02"
    assert validate_inputs(inputs, strings)["s"].item() == b"\x00\x01\x02"
    inputs, _ = json_to_inputs({"inputs": {"s": "text"}}, strings)
    assert inputs["s"].item() == b"text"
