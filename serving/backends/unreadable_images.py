"""Which input and row hold the image a model could not decode.

TensorFlow stops a whole batch at the first image it cannot decode, with a graph error
that names an op deep inside the model (``screenshot_decoded/map/while/decode_image/
DecodeImage``) and neither the input nor the row, so a client cannot tell what to fix.
The request is lost by then and the case is rare, so only then does the gateway try the
request's values with the same decoder and name the first one that fails, with what it
looks like: random bytes, a truncated PNG, or base64 text sent without its
``{"b64": ...}`` wrapper.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator, Mapping

import numpy as np
import tensorflow as tf

# TensorFlow's image decoding ops; a graph error naming one of them is a decoding failure.
DECODE_OPS = (
    "DecodeImage",
    "DecodePng",
    "DecodeJpeg",
    "DecodeAndCropJpeg",
    "DecodeGif",
    "DecodeBmp",
)
# The first bytes of each format ``tf.io.decode_image`` reads (BMP: see ``_format``).
SIGNATURES = {
    b"\x89PNG\r\n\x1a\n": "PNG",
    b"\xff\xd8\xff": "JPEG",
    b"GIF87a": "GIF",
    b"GIF89a": "GIF",
}
_FAILING_NODE = re.compile(r"Detected at node '?([\w./-]+)")


def unreadable_image(exc: BaseException, inputs: Mapping[str, np.ndarray]) -> str | None:
    """``input 'screenshot', row 3: not a PNG/JPEG/GIF/BMP image``, or None.

    None when ``exc`` is not an image decoding failure, or when no value of the request
    fails to decode (the model failed on something it made itself).
    """
    message = getattr(exc, "message", None) or str(exc)
    if not any(op in message for op in DECODE_OPS):
        return None
    for name in _image_inputs(message, inputs):
        for row, value in _rows(inputs[name]):
            problem = _problem(value)
            if problem:
                return f"input {name!r}, row {row}: {problem}"
    return None


def _image_inputs(message: str, inputs: Mapping[str, np.ndarray]) -> list[str]:
    """The string inputs that can hold the image, most likely first.

    The failing op's path usually starts with the layer that decodes the input, named
    after it (``screenshot_decoded/...``); a model's own naming may not, so then the
    inputs where some value looks like an image come first. Text inputs would fail the
    decoder too, so an input with nothing image-like is never blamed.
    """
    strings = [name for name, array in inputs.items() if array.dtype.kind in "OSU"]
    node = _FAILING_NODE.search(message)
    path = node.group(1) if node else ""
    named = [name for name in strings if re.match(rf"{re.escape(name)}(?:[_/]|$)", path)]
    image_like = [
        name
        for name in strings
        if name not in named and any(_looks_like_an_image(v) for _, v in _rows(inputs[name]))
    ]
    return named + image_like


def _rows(array: np.ndarray) -> Iterator[tuple[int, bytes]]:
    """Each value as bytes, with the row (index along the first axis) it belongs to."""
    rows = array.reshape(1, -1) if array.ndim == 0 else array.reshape(len(array), -1)
    for row, values in enumerate(rows):
        for value in values:
            yield row, value if isinstance(value, bytes) else str(value).encode()


def _problem(data: bytes) -> str | None:
    """Why ``data`` is not an image TensorFlow decodes; None when it is (or it is missing)."""
    if not data:
        return None  # a missing image: the decoders read it as a blank one
    try:
        tf.io.decode_image(data, expand_animations=False)
        return None
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError):
        pass
    kind = _format(data)
    if kind:
        return f"a truncated or corrupt {kind} image ({len(data)} bytes)"
    if _format(_base64_decoded(data)):
        return 'base64 text, not image bytes: send it as {"b64": "<the text>"}'
    return "not a PNG/JPEG/GIF/BMP image"


def _looks_like_an_image(data: bytes) -> bool:
    return bool(_format(data) or _format(_base64_decoded(data)))


def _format(data: bytes) -> str | None:
    """The image format ``data`` starts as, if any."""
    if data.startswith(b"BM") and data[6:10] == b"\0\0\0\0":  # "BM", size, reserved zeros
        return "BMP"
    return next((kind for magic, kind in SIGNATURES.items() if data.startswith(magic)), None)


def _base64_decoded(data: bytes) -> bytes:
    """The first bytes ``data`` stands for as base64 (standard or URL-safe); b"" if it is not."""
    head = data[:64].strip()
    head = head[: len(head) // 4 * 4]
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            return decode(head)
        except (binascii.Error, ValueError):
            continue
    return b""
