"""Numeric vectors of plain Python numbers take C-speed paths through conformance, hashing,
statistics and encoding; each must give exactly what the value-at-a-time path gives."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest

from contracts.features import FeatureSpec, encode_example
from research.data import stats
from research.data.records import canonical_bytes
from research.data.schema import ConformError, conform_value
from research.data.spec import FieldSchema
from research.data.stats import StatisticsCombineFn

VECTORS = [
    [0.5, 1.0, -2.25, 3e-300, 1e38],
    [1, 2, 3, -(2**62)],
    [1, 2.5, 0, -7.0],
    [0.1 + 0.2, -0.0, 5e-324],
]


def item_by_item(value: list) -> bytes:
    return b"l" + b"\x1f".join(canonical_bytes(item) for item in value)


@pytest.mark.parametrize("vector", VECTORS)
def test_a_plain_vector_hashes_to_the_bytes_of_its_items(vector):
    assert canonical_bytes(vector) == item_by_item(vector)
    assert canonical_bytes(tuple(vector)) == item_by_item(vector)


def test_a_vector_with_a_bool_or_a_none_keeps_its_own_bytes():
    assert canonical_bytes([1, True]) == b"li1\x1fi1"
    assert canonical_bytes([1.0, None]) == b"lf1.0\x1f\x00"
    assert canonical_bytes([]) == b"l"


@pytest.mark.parametrize("vector", VECTORS)
def test_a_plain_vector_conforms_as_its_spelled_numbers_do(vector):
    field = FieldSchema(type="numeric", dtype="float32", shape=[len(vector)])
    fast = conform_value("v", vector, field)
    spelled = conform_value("v", [repr(item) for item in vector], field)
    assert fast == spelled
    assert [type(item) for item in fast] == [float] * len(vector)


@pytest.mark.parametrize(
    "vector, detail",
    [
        ([1.0, float("nan")], "item 1: NaN"),
        ([float("inf"), 1.0], "item 0: not finite"),
        ([1.0, 1e39], "item 1: out of float32 range"),
        ([1.0, 10**400], "item 1: out of float32 range"),
    ],
)
def test_a_vector_the_fast_path_refuses_gets_the_item_by_item_error(vector, detail):
    field = FieldSchema(type="numeric", dtype="float32", shape=[len(vector)])
    with pytest.raises(ConformError, match=detail):
        conform_value("v", vector, field)


def test_int64_vectors_keep_whole_numbers_and_refuse_the_rest_by_item():
    field = FieldSchema(type="numeric", dtype="int64", shape=[3])
    assert conform_value("v", [1, -(2**63), 2**63 - 1], field) == [1, -(2**63), 2**63 - 1]
    assert conform_value("v", [1, 2.0, 3], field) == [1, 2, 3]
    with pytest.raises(ConformError, match="item 2: out of int64 range"):
        conform_value("v", [1, 2, 2**63], field)
    with pytest.raises(ConformError, match="item 1: not a whole number"):
        conform_value("v", [1, 2.5, 3], field)


def test_vector_statistics_equal_those_of_the_same_numbers_as_numpy_scalars(monkeypatch):
    """Numpy scalars go through ``_as_number`` one at a time; plain numbers through the
    Counter. With a small pending limit both fold many times, in merges too."""
    monkeypatch.setattr(stats, "_PENDING_LIMIT", 7)
    rng = random.Random(3)
    features = {
        "v": FeatureSpec(name="v", type="numeric", shape=(4,)),
        "c": FeatureSpec(name="c", type="numeric", shape=(4,), clip=(0.0, 2.0), transform="log"),
        "n": FeatureSpec(name="n", type="numeric", dtype="int64", shape=(4,)),
    }

    def draw() -> float:
        return rng.choice([0.0, 1.0, 1.5, round(rng.uniform(-5, 5), 3)])

    plain = [
        {
            "v": [draw() for _ in range(4)],
            "c": [draw() for _ in range(4)],
            "n": [rng.randint(-(2**62), 2**62) for _ in range(4)],
        }
        for _ in range(300)
    ]
    numpy_scalars = [
        {
            "v": list(map(np.float64, r["v"])),
            "c": list(map(np.float64, r["c"])),
            "n": list(map(np.int64, r["n"])),
        }
        for r in plain
    ]

    def merged(records: list[dict]) -> dict:
        fn = StatisticsCombineFn(features)
        parts = []
        for start in range(0, len(records), 70):
            accumulator = fn.create_accumulator()
            for record in records[start : start + 70]:
                fn.add_input(accumulator, record)
            parts.append(accumulator)
        return fn.extract_output(fn.merge_accumulators(parts))

    result = merged(plain)
    assert result == merged(numpy_scalars)
    values = [item for record in plain for item in record["v"]]
    exact_mean = sum(map(Fraction, values)) / len(values)
    assert result["features"]["v"]["mean"] == float(exact_mean)
    assert (result["features"]["v"]["min"], result["features"]["v"]["max"]) == (
        min(values),
        max(values),
    )


def test_a_plain_vector_encodes_as_the_same_values_as_numpy_scalars():
    features = {"v": FeatureSpec(name="v", type="numeric", shape=(4,))}
    vector = [0.1, 2, -3.5, 1e39]
    as_numpy = [np.float64(item) for item in vector]
    assert encode_example({"v": vector}, features) == encode_example({"v": as_numpy}, features)
