"""Examples serialised without TensorFlow are the Examples TensorFlow would build.

The reference side of every check is TensorFlow's own ``tf.train.Example`` (protobuf)
and its parser, never ``contracts.example_encoding``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.example_encoding import (
    bytes_feature,
    float_feature,
    int64_feature,
    serialize_example,
)
from contracts.features import FeatureSpec, encode_example, parsing_spec

INT64 = st.integers(-(2**63), 2**63 - 1)
# Every double: nan, infinities, values beyond float32 (protobuf makes them infinite),
# subnormals that round to zero.
FLOATS = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)  # UTF-8 encodable

FEATURES = {
    spec.name: spec
    for spec in (
        FeatureSpec("score", "numeric"),
        FeatureSpec("grid", "numeric", shape=(2, 3)),
        FeatureSpec("count", "numeric", dtype="int64"),
        FeatureSpec("offsets", "numeric", dtype="int64", shape=(3,)),
        FeatureSpec("colour", "categorical", vocabulary=("red", "blue")),
        FeatureSpec("label", "categorical", vocabulary=("a", "b"), is_label=True),
        FeatureSpec("body", "text", vocab_size=70_000),
        FeatureSpec("photo", "image", height=2, width=2, channels=1),
        # A key that has another as its prefix, and a non-ASCII key: map order.
        FeatureSpec("body2", "text"),
        FeatureSpec("é", "categorical"),
    )
}


def feature_value(spec: FeatureSpec) -> st.SearchStrategy[Any]:
    """Values the builder hands to ``encode_example`` for one feature, or None (missing)."""
    if spec.type == "numeric":
        scalar = INT64 if spec.dtype == "int64" else FLOATS
        if spec.shape:
            size = math.prod(spec.shape)
            flat = st.lists(scalar, min_size=size, max_size=size)
            array = flat.map(lambda values: np.array(values, dtype=object).reshape(spec.shape))
            return st.one_of(st.none(), flat, array, array.map(lambda a: a.tolist()))
        return st.one_of(st.none(), scalar)
    if spec.type == "image":
        return st.one_of(st.none(), st.binary(max_size=64))
    return st.one_of(st.none(), TEXT)


RECORDS = st.fixed_dictionaries({name: feature_value(spec) for name, spec in FEATURES.items()})


def reference_example(record: dict[str, Any]) -> tf.train.Example:
    """The feature contract (contracts/features.py) built with TensorFlow's protobuf."""
    feature: dict[str, tf.train.Feature] = {}
    for name, spec in FEATURES.items():
        value = record.get(name)
        if value is None:
            continue
        if spec.type == "numeric":
            values = np.asarray(value, dtype=object).reshape(-1).tolist()
            if spec.dtype == "int64":
                feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
            else:
                feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
        else:
            data = value if isinstance(value, bytes) else value.encode("utf-8")
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[data]))
    return tf.train.Example(features=tf.train.Features(feature=feature))


def canonical(example: tf.train.Example) -> bytes:
    """One encoding per Example, for comparing Examples that hold nan."""
    return example.SerializeToString(deterministic=True)


@settings(max_examples=400, deadline=None)
@given(record=RECORDS)
def test_records_encode_as_tensorflow_builds_them(record: dict[str, Any]) -> None:
    ours = encode_example(record, FEATURES)
    assert canonical(tf.train.Example.FromString(ours)) == canonical(reference_example(record))


@settings(max_examples=200, deadline=None)
@given(record=RECORDS)
def test_the_encoding_does_not_depend_on_feature_order(record: dict[str, Any]) -> None:
    reversed_features = dict(reversed(FEATURES.items()))
    assert encode_example(record, FEATURES) == encode_example(record, reversed_features)


def single_feature_bytes(feature: tf.train.Feature) -> bytes:
    example = tf.train.Example(features=tf.train.Features(feature={"k": feature}))
    return example.SerializeToString()


@pytest.mark.parametrize(
    "values",
    [[], [0], [1, -1], [127, 128, 16383, 16384], [2**63 - 1, -(2**63)], list(range(-300, 300))],
)
def test_an_int64_list_is_the_bytes_protobuf_writes(values: list[int]) -> None:
    expected = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    assert serialize_example({"k": int64_feature(values)}) == single_feature_bytes(expected)


@pytest.mark.parametrize(
    "values",
    [[], [0.0, -0.0], [0.1, 1e-46, 1e39, -1e39], [math.inf, -math.inf, math.nan, -math.nan]],
)
def test_a_float_list_is_the_bytes_protobuf_writes(values: list[float]) -> None:
    expected = tf.train.Feature(float_list=tf.train.FloatList(value=values))
    assert serialize_example({"k": float_feature(values)}) == single_feature_bytes(expected)


@pytest.mark.parametrize(
    "values", [[], [b""], ["naïve 数据 🚀".encode()], [b"\x00\xff" * 100, b"x" * 300]]
)
def test_a_bytes_list_is_the_bytes_protobuf_writes(values: list[bytes]) -> None:
    expected = tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
    assert serialize_example({"k": bytes_feature(values)}) == single_feature_bytes(expected)


def test_an_example_with_no_features_parses_as_an_empty_example() -> None:
    assert tf.train.Example.FromString(serialize_example({})) == tf.train.Example(
        features=tf.train.Features()
    )


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1])
def test_an_integer_beyond_int64_is_refused(value: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        int64_feature([1, value])


PARSED = {
    "score": FLOATS,
    "grid": st.lists(FLOATS, min_size=6, max_size=6),
    "count": INT64,
    "offsets": st.lists(INT64, min_size=3, max_size=3),
    "colour": TEXT,
    "label": TEXT,
    "body": TEXT,
    "photo": st.binary(max_size=64),
    "body2": TEXT,
    "é": TEXT,
}


@settings(max_examples=100, deadline=None)
@given(record=st.fixed_dictionaries({}, optional=PARSED))
def test_tensorflows_parser_reads_back_every_value(record: dict[str, Any]) -> None:
    """Through the parsing spec the input pipeline uses; a missing feature reads as its
    default."""
    parsed = tf.io.parse_single_example(encode_example(record, FEATURES), parsing_spec(FEATURES))
    for name, spec in FEATURES.items():
        value = record.get(name)
        got = parsed[name].numpy()
        if spec.type == "numeric":
            dtype = np.int64 if spec.dtype == "int64" else np.float32
            expected = np.zeros(spec.shape, dtype) if value is None else np.asarray(value)
            with np.errstate(over="ignore"):  # beyond float32 is infinite, as in protobuf
                expected = expected.astype(dtype).reshape(spec.shape)
            np.testing.assert_array_equal(got, expected)
        else:
            default = b"" if value is None else value
            assert got == (default if isinstance(default, bytes) else default.encode("utf-8"))
