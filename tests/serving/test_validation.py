"""Request tensors against a signature: names, exact types, shapes, batch size, messages."""

from __future__ import annotations

import numpy as np
import pytest

from serving.errors import InvalidArgument
from serving.signature import Signature, TensorSpec
from serving.validation import validate_inputs

SIGNATURE = Signature(
    "serving_default",
    {
        "image": TensorSpec("image", np.dtype(np.float32), (None, 8, 8, 1)),
        "extra": TensorSpec("extra", np.dtype(np.int64), (None, 3)),
    },
    {"label": TensorSpec("label", np.dtype(np.float32), (None, 10))},
)


def good(batch: int = 2) -> dict[str, np.ndarray]:
    return {
        "image": np.zeros((batch, 8, 8, 1), np.float32),
        "extra": np.zeros((batch, 3), np.int64),
    }


def refused(inputs: dict, signature: Signature = SIGNATURE) -> str:
    with pytest.raises(InvalidArgument) as caught:
        validate_inputs(inputs, signature)
    return caught.value.message


def test_matching_inputs_pass_through_untouched() -> None:
    inputs = good()
    checked = validate_inputs(inputs, SIGNATURE)
    assert all(checked[name] is inputs[name] for name in inputs)


def test_empty_batch_is_valid() -> None:
    assert validate_inputs(good(0), SIGNATURE)["image"].shape == (0, 8, 8, 1)


def test_message_says_what_was_expected() -> None:
    inputs = good() | {"image": np.zeros((2, 8, 8), np.int64)}
    assert refused(inputs) == "input 'image': expected float32 [-1, 8, 8, 1], got int64 [2, 8, 8]"


def test_missing_and_unknown_names() -> None:
    assert refused({"image": good()["image"]}) == (
        "missing input 'extra'; signature 'serving_default' takes "
        "image: float32 [-1, 8, 8, 1], extra: int64 [-1, 3]"
    )
    assert refused(good() | {"mask": np.zeros(2)}) == (
        "unknown input 'mask'; signature 'serving_default' takes image, extra"
    )


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("image", np.ones((2, 8, 8, 1), np.int32), "Expects arg[1] to be float but int32 is provided"),
        ("image", np.ones((2, 8, 8, 1), np.float64), "Expects arg[1] to be float but double is provided"),
        ("image", np.ones((2, 8, 8, 1), np.float16), "Expects arg[1] to be float but half is provided"),
        ("image", np.ones((2, 8, 8, 1), np.bool_), "Expects arg[1] to be float but bool is provided"),
        ("extra", np.ones((2, 3), np.int32), "Expects arg[0] to be int64 but int32 is provided"),
        ("extra", np.ones((2, 3), np.float32), "Expects arg[0] to be int64 but float is provided"),
        ("extra", np.ones((2, 3), np.uint64), "Expects arg[0] to be int64 but uint64 is provided"),
        ("extra", np.array([["a", "b", "c"]] * 2), "Expects arg[0] to be int64 but string is provided"),
    ],
)  # fmt: skip
def test_types_must_match_exactly_as_in_tensorflow_serving(
    name: str, value: np.ndarray, message: str
) -> None:
    """No cast, not even a widening one: TF Serving feeds the tensor as sent."""
    got = refused(good() | {name: value})
    assert got.startswith(message + " (")
    assert f"input {name!r}: expected {SIGNATURE.inputs[name].describe()}, got " in got


def test_argument_numbers_follow_the_sorted_graph_tensor_names() -> None:
    signature = Signature(
        "s",
        {
            "a": TensorSpec("a", np.dtype(np.float32), (None,), "serving_default_z:0"),
            "b": TensorSpec("b", np.dtype(np.float32), (None,), "serving_default_b:0"),
        },
        {},
    )
    inputs = {"a": np.zeros(1, np.float32), "b": np.zeros(1, np.float32)}
    assert refused(inputs | {"a": np.zeros(1, np.int32)}, signature).startswith(
        "Expects arg[1] to be float but int32 is provided"
    )
    assert refused(inputs | {"b": np.zeros(1, np.int8)}, signature).startswith(
        "Expects arg[0] to be float but int8 is provided"
    )


def test_the_other_byte_order_is_the_same_type() -> None:
    inputs = {
        "image": np.ones((2, 8, 8, 1), ">f4"),
        "extra": np.full((2, 3), 7, ">i8"),
    }
    checked = validate_inputs(inputs, SIGNATURE)
    assert checked["image"].dtype == np.float32 and checked["extra"].dtype == np.int64
    assert checked["image"].sum() == 128 and checked["extra"].sum() == 42


def test_repeated_values_are_written_out_once_they_fit() -> None:
    inputs = {
        "image": np.broadcast_to(np.float32(0.5), (2, 8, 8, 1)),
        "extra": np.broadcast_to(np.int64(3), (2, 3)),
    }
    checked = validate_inputs(inputs, SIGNATURE)
    assert checked["image"].flags.c_contiguous and checked["image"].sum() == 64
    assert checked["extra"].tolist() == [[3, 3, 3], [3, 3, 3]]


def test_repeated_values_beyond_the_message_size_are_refused() -> None:
    signature = Signature("s", {"x": TensorSpec("x", np.dtype(np.float32), (None, 1024))}, {})
    huge = {"x": np.broadcast_to(np.float32(1), (1 << 20, 1024))}
    assert refused(huge, signature) == (
        "input 'x': shape [1048576, 1024] float32 is larger than 67108864 bytes, the largest "
        "message this server accepts; send fewer elements"
    )
    with pytest.raises(InvalidArgument, match="larger than 4096 bytes"):
        validate_inputs({"x": np.broadcast_to(np.float32(1), (2, 1024))}, signature, max_bytes=4096)
    # A shape the signature refuses is refused as such, whatever its size.
    assert refused({"x": np.broadcast_to(np.float32(1), (1 << 20, 1023))}, signature) == (
        "input 'x': expected float32 [-1, 1024], got float32 [1048576, 1023]"
    )


@pytest.mark.parametrize(
    ("shape", "got"),
    [((2, 8, 8, 2), "[2, 8, 8, 2]"), ((2, 64), "[2, 64]"), ((8, 8, 1), "[8, 8, 1]")],
)
def test_shapes_must_fit_the_spec(shape: tuple[int, ...], got: str) -> None:
    message = refused(good() | {"image": np.zeros(shape, np.float32)})
    assert message == f"input 'image': expected float32 [-1, 8, 8, 1], got float32 {got}"


def test_free_dimensions_and_unknown_rank_accept_any_size() -> None:
    signature = Signature(
        "s",
        {
            "tokens": TensorSpec("tokens", np.dtype(np.int32), (None, None)),
            "anything": TensorSpec("anything", np.dtype(np.float32), None),
        },
        {},
    )
    checked = validate_inputs(
        {"tokens": np.zeros((3, 17), np.int32), "anything": np.zeros((2, 2, 2), np.float32)},
        signature,
    )
    assert checked["tokens"].shape == (3, 17)


def test_inputs_may_differ_in_their_first_dimension() -> None:
    # TF Serving's columnar format allows it; the model decides what it means.
    checked = validate_inputs(good() | {"extra": np.zeros((3, 3), np.int64)}, SIGNATURE)
    assert (checked["image"].shape[0], checked["extra"].shape[0]) == (2, 3)


def test_strings_become_bytes() -> None:
    signature = Signature("s", {"text": TensorSpec("text", np.dtype(object), (None,))}, {})
    for value in (np.array(["héllo", "b"]), np.array(["héllo", b"b"], dtype=object)):
        checked = validate_inputs({"text": value}, signature)["text"]
        assert checked.dtype == object and checked.tolist() == ["héllo".encode(), b"b"]
    message = refused({"text": np.array([b"a", 3], dtype=object)}, signature)
    assert message == "input 'text': expected string [-1], got an element of type int"
    assert refused({"text": np.zeros(2)}, signature) == (
        "Expects arg[0] to be string but double is provided "
        "(input 'text': expected string [-1], got float64 [2])"
    )
