"""Request tensors against a signature: names, safe casts, shapes, batch size, messages."""

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
    ("image_dtype", "extra_dtype"),
    [(np.int32, np.int64), (np.uint8, np.int8), (np.int64, np.uint32), (np.float16, np.int16)],
)
def test_lossless_casts_are_applied(image_dtype: type, extra_dtype: type) -> None:
    inputs = {
        "image": np.ones((2, 8, 8, 1), image_dtype),
        "extra": np.full((2, 3), 7, extra_dtype),
    }
    checked = validate_inputs(inputs, SIGNATURE)
    assert checked["image"].dtype == np.float32 and checked["extra"].dtype == np.int64
    assert checked["image"].sum() == 128 and checked["extra"].sum() == 42


@pytest.mark.parametrize(
    ("name", "value", "got"),
    [
        ("image", np.zeros((2, 8, 8, 1), np.float64), "float64 [2, 8, 8, 1]"),
        ("image", np.zeros((2, 8, 8, 1), np.bool_), "bool [2, 8, 8, 1]"),
        ("extra", np.zeros((2, 3), np.float32), "float32 [2, 3]"),
        ("extra", np.zeros((2, 3), np.uint64), "uint64 [2, 3]"),
        ("extra", np.array([["a", "b", "c"]] * 2), "string [2, 3]"),
    ],
)
def test_lossy_casts_are_refused(name: str, value: np.ndarray, got: str) -> None:
    assert refused(good() | {name: value}).endswith(f", got {got}")


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


def test_inputs_must_agree_on_batch_size() -> None:
    inputs = good() | {"extra": np.zeros((3, 3), np.int64)}
    assert refused(inputs) == "inputs disagree on batch size: 'image' has 2, 'extra' has 3"


def test_strings_become_bytes() -> None:
    signature = Signature("s", {"text": TensorSpec("text", np.dtype(object), (None,))}, {})
    for value in (np.array(["héllo", "b"]), np.array(["héllo", b"b"], dtype=object)):
        checked = validate_inputs({"text": value}, signature)["text"]
        assert checked.dtype == object and checked.tolist() == ["héllo".encode(), b"b"]
    message = refused({"text": np.array([b"a", 3], dtype=object)}, signature)
    assert message == "input 'text': expected string [-1], got an element of type int"
    assert refused({"text": np.zeros(2)}, signature) == (
        "input 'text': expected string [-1], got float64 [2]"
    )
