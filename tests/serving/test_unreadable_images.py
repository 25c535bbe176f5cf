"""An image a model cannot decode is named by input and row, with what it looks like."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import tensorflow as tf

from serving.backends.base import model_failure
from serving.backends.unreadable_images import unreadable_image
from serving.errors import InvalidArgument


def png(value: int = 7) -> bytes:
    return tf.io.encode_png(tf.fill([4, 4, 1], tf.constant(value, tf.uint8))).numpy()


@tf.function
def decode_all(photos: tf.Tensor) -> tf.Tensor:
    """Decodes as a researcher's own model might: a layer name that is not the input's."""
    return tf.map_fn(
        lambda image: tf.image.resize(
            tf.io.decode_image(image, 1, expand_animations=False), [4, 4]
        ),
        photos,
        fn_output_signature=tf.float32,
    )


def failure(photos: list[bytes]) -> tf.errors.OpError:
    with pytest.raises(tf.errors.OpError) as raised:
        decode_all(tf.constant(photos))
    return raised.value


CASES = {
    "random bytes": (bytes(range(40)), "not a PNG/JPEG/GIF/BMP image"),
    "a truncated PNG": (png()[:30], "a truncated or corrupt PNG image (30 bytes)"),
    "unwrapped base64": (
        base64.b64encode(png()),
        'base64 text, not image bytes: send it as {"b64"',
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_row_and_the_kind_of_bad_image_are_named(case: str) -> None:
    bad, explanation = CASES[case]
    photos = [png(1), png(2), b"", bad, png(4)]
    inputs = {
        # A text input first: text fails the decoder too, but holds nothing image-like.
        "description": np.array([b"BMW, blue", b"a car", b"", b"four doors", b"red"], object),
        "photo": np.array(photos, object).reshape(5, 1),
        "price": np.arange(5, dtype=np.float32),
    }
    error = model_failure(failure(photos), inputs)
    assert isinstance(error, InvalidArgument)
    assert str(error.message).startswith("input 'photo', row 3: "), error.message
    assert explanation in error.message
    assert "Graph execution" not in error.message


def test_an_input_named_by_the_failing_op_is_blamed_even_if_nothing_in_it_is_an_image() -> None:
    exc = tf.errors.InvalidArgumentError(
        None,
        None,
        "Detected at node photo_decoded/map/while/DecodeImage: Unknown image file format",
    )
    inputs = {
        "caption": np.array([b"\x89PNG\r\n\x1a\n"], object),
        "photo": np.array([b"junk"], object),
    }
    assert unreadable_image(exc, inputs) == "input 'photo', row 0: not a PNG/JPEG/GIF/BMP image"


def test_other_failures_are_left_as_they_are() -> None:
    inputs = {"photo": np.array([bytes(range(40))], object)}
    assert unreadable_image(ValueError("shapes differ in ConcatOp"), inputs) is None
    # Every image decodes: the model failed on something of its own.
    exc = tf.errors.InvalidArgumentError(None, None, "DecodePng: something internal")
    assert unreadable_image(exc, {"photo": np.array([png(), b""], object)}) is None
