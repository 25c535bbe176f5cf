"""A REST body of ``LARGE_BODY_BYTES`` or more decodes exactly as a small one does.

Large bodies are decoded in a worker process, which receives the candidate signatures
pickled: every dtype arrives as an equal but distinct ``np.dtype`` object. Each body
format (rows, columns, base64 in both) and each input dtype is decoded both ways here,
the large way through a pickle round trip as the worker sees it.
"""

from __future__ import annotations

import base64
import json
import pickle
from typing import Any

import numpy as np
import pytest
from tensorflow.core.example.example_pb2 import Example

from serving.rest_api import LARGE_BODY_BYTES, _prepare_examples, _prepare_predict, parse_json
from serving.signature import Signature, TensorSpec
from serving.tensors import json_to_inputs

SIGNATURE = Signature(
    "serving_default",
    {
        "product": TensorSpec("product", np.dtype(object), (None,)),
        "screenshot": TensorSpec("screenshot", np.dtype(object), (None,)),
        "minutes": TensorSpec("minutes", np.dtype(np.float32), (None,)),
        "sizes": TensorSpec("sizes", np.dtype(np.float32), (None, 2)),
        "count": TensorSpec("count", np.dtype(np.int64), (None,)),
    },
    {},
)
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(64))


def row(index: int) -> dict[str, Any]:
    return {
        "product": ("web_portal", "mobile_app", "café")[index % 3],
        "screenshot": {"b64": base64.b64encode(PNG + bytes([index % 256])).decode()},
        "minutes": index * 0.5,
        "sizes": [index + 0.5, index + 1.5],
        "count": index,
    }


def body_of(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode()


def rows_body(count: int) -> bytes:
    return body_of({"instances": [row(i) for i in range(count)]})


def columns_body(count: int) -> bytes:
    rows = [row(i) for i in range(count)]
    return body_of({"inputs": {name: [r[name] for r in rows] for name in rows[0]}})


def large(make: Any) -> bytes:
    """The smallest body of this shape at or above the threshold."""
    count = 1
    while len(make(count)) < LARGE_BODY_BYTES:
        count *= 2
    return make(count)


@pytest.mark.parametrize("make", [rows_body, columns_body], ids=["rows", "columns"])
def test_a_large_body_decodes_every_dtype_as_a_small_one(make: Any) -> None:
    for body in (make(7), large(make)):
        expected, row_format = json_to_inputs(parse_json(body), SIGNATURE)
        candidates = pickle.loads(pickle.dumps({"serving_default": [SIGNATURE]}))
        name, [(signature, decoded)] = _prepare_predict(body, candidates)
        assert name == "serving_default" and signature == SIGNATURE
        inputs, decoded_row_format = decoded
        assert decoded_row_format == row_format == (make is rows_body)
        assert set(inputs) == set(expected)
        for key, array in expected.items():
            assert inputs[key].dtype == array.dtype, key
            np.testing.assert_array_equal(inputs[key], array)
        assert inputs["product"][1] == b"mobile_app"
        assert inputs["screenshot"][0] == PNG + b"\x00"


def test_a_large_examples_body_keeps_strings_and_numbers() -> None:
    count = 1
    while len(body := body_of({"examples": [row(i) for i in range(count)]})) < LARGE_BODY_BYTES:
        count *= 2
    _, serialized, _ = _prepare_examples(body)
    first = Example.FromString(serialized[2]).features.feature
    assert first["product"].bytes_list.value == ["café".encode()]
    assert first["screenshot"].bytes_list.value == [PNG + b"\x02"]
    assert list(first["sizes"].float_list.value) == [2.5, 3.5]
    assert len(serialized) == count
