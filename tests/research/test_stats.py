"""Statistics combiner: each feature type, exact quantiles, merge order, Beam wiring."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections import Counter

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from contracts.features import FeatureSpec
from research.data.records import TOKEN_COUNTS
from research.data.runners import IN_PROCESS_RUNNER as FN_API_RUNNER
from research.data.stats import (
    MAX_FREQUENCIES,
    ComputeStatistics,
    StatisticsCombineFn,
    empty_statistics,
    nearest_rank_quantiles,
)

FEATURES = {
    "x": FeatureSpec(name="x", type="numeric"),
    "vec": FeatureSpec(name="vec", type="numeric", shape=(3,)),
    "n": FeatureSpec(name="n", type="numeric", dtype="int64"),
    "colour": FeatureSpec(name="colour", type="categorical"),
    "text": FeatureSpec(name="text", type="text", vocab_size=100),
    "image": FeatureSpec(name="image", type="image", height=2, width=2, channels=1),
}


def single_pass(features, records):
    fn = StatisticsCombineFn(features)
    accumulator = fn.create_accumulator()
    for record in records:
        accumulator = fn.add_input(accumulator, record)
    return fn.extract_output(accumulator)


def random_records(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    records = []
    for _ in range(count):
        words = rng.randint(0, 12)
        text = " ".join("w" * rng.randint(1, 6) for _ in range(words))
        records.append(
            {
                # A large offset makes naive float accumulation order-sensitive.
                "x": 1e8 + rng.gauss(0.0, 1.0) if rng.random() > 0.1 else None,
                "vec": [rng.uniform(-1e3, 1e3) for _ in range(3)],
                "n": rng.randint(-(2**40), 2**40),
                "colour": rng.choice(["red", "green", "blue", "teal", None]),
                "text": text,
                TOKEN_COUNTS: {"text": words},
                "image": b"png" if rng.random() > 0.2 else None,
                "_rank": "ignored",
            }
        )
    return records


def test_numeric_scalar_statistics_are_exact():
    records = [{"x": v} for v in (1.0, 2.0, 3.0, 4.0)] + [{"x": None}, {}]
    stats = single_pass({"x": FEATURES["x"]}, records)["features"]["x"]
    assert stats == {
        "type": "numeric",
        "count": 4,
        "missing": 2,
        "min": 1.0,
        "max": 4.0,
        "mean": 2.5,
        "std": math.sqrt(1.25),
    }


def test_numeric_std_survives_catastrophic_cancellation():
    # sum(x^2)/n - mean^2 in doubles loses every digit here; the exact form does not.
    records = [{"x": 1e9 + offset} for offset in (0.0, 1.0, 2.0)]
    stats = single_pass({"x": FEATURES["x"]}, records)["features"]["x"]
    assert stats["mean"] == 1e9 + 1.0
    assert stats["std"] == math.sqrt(2.0 / 3.0)


def test_a_clipped_log_feature_also_has_the_statistics_of_its_values_as_read():
    spec = FeatureSpec(name="income", type="numeric", clip=(-10.0, 1e6), transform="log")
    raw = [0.0, 3.0, 250.0, 4.2e4, 9e9, -50.0]
    halves = [[{"income": v} for v in raw[:2]], [{"income": v} for v in raw[2:]]]
    fn = StatisticsCombineFn({"income": spec})
    parts = []
    for half in halves:  # merged from two bundles, as a runner would
        accumulator = fn.create_accumulator()
        for record in half:
            accumulator = fn.add_input(accumulator, record)
        parts.append(accumulator)
    stats = fn.extract_output(fn.merge_accumulators(parts))["features"]["income"]

    read = np.clip(np.array(raw), -10.0, 1e6)
    read = np.sign(read) * np.log1p(np.abs(read))
    assert (stats["min"], stats["max"]) == (-50.0, 9e9)  # the data as it is
    assert stats["mean"] == pytest.approx(np.mean(raw), rel=1e-15)
    assert stats["as_read"]["mean"] == pytest.approx(read.mean(), rel=1e-15)
    assert stats["as_read"]["std"] == pytest.approx(read.std(), rel=1e-15)
    plain = single_pass({"x": FEATURES["x"]}, [{"x": 1.0}])["features"]["x"]
    assert "as_read" not in plain


def test_numeric_vector_statistics_cover_every_value():
    records = [{"vec": [1.0, 2.0, 3.0]}, {"vec": np.array([4.0, 5.0, 6.0])}, {"vec": []}]
    stats = single_pass({"vec": FEATURES["vec"]}, records)["features"]["vec"]
    values = np.arange(1.0, 7.0)
    assert stats["count"] == 2
    assert stats["missing"] == 1
    assert (stats["min"], stats["max"]) == (1.0, 6.0)
    assert stats["mean"] == pytest.approx(values.mean(), rel=1e-15)
    assert stats["std"] == pytest.approx(values.std(), rel=1e-15)


def test_non_finite_values_are_left_out_of_the_moments():
    records = [{"x": 1.0}, {"x": float("nan")}, {"x": float("inf")}, {"x": 3.0}]
    stats = single_pass({"x": FEATURES["x"]}, records)["features"]["x"]
    assert stats["count"] == 4
    assert (stats["min"], stats["max"], stats["mean"], stats["std"]) == (1.0, 3.0, 2.0, 1.0)


def test_int64_extremes_stay_integers():
    big = 2**62 + 1  # not representable as a double
    records = [{"n": big}, {"n": np.int64(-5)}]
    stats = single_pass({"n": FEATURES["n"]}, records)["features"]["n"]
    assert stats["min"] == -5 and isinstance(stats["min"], int)
    assert stats["max"] == big and isinstance(stats["max"], int)
    assert isinstance(stats["mean"], float)


def test_categorical_frequencies_and_missing():
    values = ["b", "a", "b", None, "", "c", "a", "b"]
    stats = single_pass({"colour": FEATURES["colour"]}, [{"colour": v} for v in values])
    colour = stats["features"]["colour"]
    assert colour == {
        "type": "categorical",
        "count": 6,
        "missing": 2,
        "num_distinct": 3,
        "frequencies": {"b": 3, "a": 2, "c": 1},
    }
    assert list(colour["frequencies"]) == ["b", "a", "c"]


def test_categorical_output_keeps_most_frequent_with_ties_broken_by_value():
    records = [{"colour": "common"}] * 5
    # MAX_FREQUENCIES + 5 values seen once each: the cut must keep the smallest values.
    singles = [f"v{i:05d}" for i in range(MAX_FREQUENCIES + 5)]
    records += [{"colour": value} for value in reversed(singles)]
    colour = single_pass({"colour": FEATURES["colour"]}, records)["features"]["colour"]
    assert colour["num_distinct"] == MAX_FREQUENCIES + 6
    assert colour["count"] == 5 + len(singles)
    assert len(colour["frequencies"]) == MAX_FREQUENCIES
    assert list(colour["frequencies"])[:3] == ["common", "v00000", "v00001"]
    assert "v00999" not in colour["frequencies"]
    assert colour["frequencies"]["v00998"] == 1


def test_nearest_rank_quantiles_are_exact():
    # 1..20: rank ceil(q/100 * 20): p5 -> 1st, p25 -> 5th, p50 -> 10th, p75 -> 15th, p95 -> 19th.
    assert nearest_rank_quantiles(Counter(range(1, 21))) == {
        "p0": 1,
        "p5": 1,
        "p25": 5,
        "p50": 10,
        "p75": 15,
        "p95": 19,
        "p100": 20,
    }
    skewed = Counter({0: 1, 7: 98, 1000: 1})
    assert nearest_rank_quantiles(skewed) == {
        "p0": 0,
        "p5": 7,
        "p25": 7,
        "p50": 7,
        "p75": 7,
        "p95": 7,
        "p100": 1000,
    }


def test_nearest_rank_quantiles_match_sorted_list_for_random_lengths():
    rng = random.Random(7)
    for size in (1, 2, 3, 10, 101):
        lengths = [rng.randint(0, 30) for _ in range(size)]
        ordered = sorted(lengths)
        expected = {
            f"p{q}": ordered[max(1, math.ceil(q * size / 100)) - 1]
            for q in (0, 5, 25, 50, 75, 95, 100)
        }
        assert nearest_rank_quantiles(Counter(lengths)) == expected


def test_text_length_and_token_quantiles():
    texts = ["", "ab", "abcd", "héllo", "abcdefghij"]  # 0, 2, 4, 5, 10 characters
    records = [{"text": t, TOKEN_COUNTS: {"text": len(t) // 2}} for t in texts]
    records.append({"text": None})
    stats = single_pass({"text": FEATURES["text"]}, records)["features"]["text"]
    assert stats["count"] == 5 and stats["missing"] == 1
    assert stats["length_quantiles"] == {
        "p0": 0,
        "p5": 0,
        "p25": 2,
        "p50": 4,
        "p75": 5,
        "p95": 10,
        "p100": 10,
    }
    assert stats["token_quantiles"] == {
        "p0": 0,
        "p5": 0,
        "p25": 1,
        "p50": 2,
        "p75": 2,
        "p95": 5,
        "p100": 5,
    }


def test_text_without_token_counts_has_null_token_quantiles():
    stats = single_pass({"text": FEATURES["text"]}, [{"text": "abc"}])["features"]["text"]
    assert stats["length_quantiles"]["p50"] == 3
    assert set(stats["token_quantiles"].values()) == {None}


def test_image_counts():
    records = [{"image": b"\x89PNG"}, {"image": None}, {"image": b""}, {}]
    stats = single_pass({"image": FEATURES["image"]}, records)["features"]["image"]
    assert stats == {"type": "image", "count": 1, "missing": 3}


def test_empty_input_gives_null_statistics_that_are_strict_json():
    stats = single_pass(FEATURES, [])
    assert stats == empty_statistics(FEATURES)
    assert stats["num_records"] == 0
    features = stats["features"]
    assert features["x"]["mean"] is None and features["x"]["std"] is None
    assert features["x"]["count"] == 0
    assert features["colour"]["frequencies"] == {}
    assert features["text"]["length_quantiles"]["p50"] is None
    assert features["image"] == {"type": "image", "count": 0, "missing": 0}
    json.dumps(stats, allow_nan=False)


def test_merging_partitions_in_any_order_equals_a_single_pass():
    records = random_records(400, seed=1)
    expected = single_pass(FEATURES, records)
    json.dumps(expected, allow_nan=False)

    fn = StatisticsCombineFn(FEATURES)
    rng = random.Random(3)
    for trial in range(4):
        shuffled = records[:]
        rng.shuffle(shuffled)
        cuts = sorted(rng.sample(range(1, len(shuffled)), 4 + trial))
        parts = [shuffled[a:b] for a, b in itertools.pairwise([0, *cuts, len(shuffled)])]
        accumulators = []
        for part in parts:
            accumulator = fn.create_accumulator()
            for record in part:
                accumulator = fn.add_input(accumulator, record)
            accumulators.append(accumulator)
        rng.shuffle(accumulators)
        # Merge as a tree of pairs in a random order, as a runner might.
        while len(accumulators) > 1:
            first, second = accumulators.pop(), accumulators.pop()
            accumulators.insert(
                rng.randrange(len(accumulators) + 1), fn.merge_accumulators([first, second])
            )
        assert fn.extract_output(accumulators[0]) == expected

    xs = np.array([r["x"] for r in records if r["x"] is not None])
    assert expected["features"]["x"]["mean"] == pytest.approx(xs.mean(), rel=1e-15)
    assert expected["features"]["x"]["std"] == pytest.approx(xs.std(), rel=1e-6)


def test_merge_leaves_its_inputs_untouched():
    fn = StatisticsCombineFn(FEATURES)
    left = fn.add_input(fn.create_accumulator(), random_records(1, seed=5)[0])
    right = fn.add_input(fn.create_accumulator(), random_records(1, seed=6)[0])
    before = fn.extract_output(left)
    fn.merge_accumulators([left, right])
    assert fn.extract_output(left) == before


def test_unknown_feature_type_fails_at_construction():
    with pytest.raises(ValueError, match="'odd'.*'audio'"):
        StatisticsCombineFn({"odd": FeatureSpec(name="odd", type="audio")})


def test_compute_statistics_per_split_in_a_pipeline():
    train = random_records(60, seed=10)
    test = random_records(15, seed=11)
    expected = [("train", single_pass(FEATURES, train)), ("test", single_pass(FEATURES, test))]
    pairs = [("train", r) for r in train] + [("test", r) for r in test]
    with BeamTestPipeline(runner=FN_API_RUNNER) as pipeline:
        result = pipeline | beam.Create(pairs) | ComputeStatistics(FEATURES)
        assert_that(result, equal_to(expected))


def test_categorical_values_are_counted_apart_with_the_same_result(monkeypatch):
    """Distinct values go through a keyed count and a bounded top-n, not the split's
    accumulator; the statistics are those of one pass over every value."""
    from research.data import stats

    monkeypatch.setattr(stats, "MAX_FREQUENCIES", 10)  # so the top-n is cut many times
    rng = random.Random(12)
    features = {"colour": FEATURES["colour"], "x": FEATURES["x"]}
    splits = {
        "train": [{"colour": f"id-{rng.randrange(3000)}", "x": 1.0} for _ in range(2000)],
        "test": [{"colour": rng.choice(["a", "b", "", None, 7]), "x": None} for _ in range(50)],
    }
    splits["train"] += [{"colour": "frequent", "x": 2.0}] * 30
    expected = [(split, single_pass(features, records)) for split, records in splits.items()]
    assert len(expected[0][1]["features"]["colour"]["frequencies"]) == 10
    pairs = [(split, record) for split, records in splits.items() for record in records]
    with BeamTestPipeline(runner=FN_API_RUNNER) as pipeline:
        result = pipeline | beam.Create(pairs) | ComputeStatistics(features)
        assert_that(result, equal_to(expected))
