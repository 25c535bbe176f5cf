"""Per-split dataset statistics, computed by one mergeable Beam combiner.

The output follows the statistics layout in ``contracts.dataset_manifest``. Two properties
matter more than speed here, because the statistics are the reference that later
datasets are checked against for drift:

- **Order independence.** A runner may split a split's records into any bundles and
  merge the partial results in any order. Every accumulator is therefore exact: counts,
  Counters of values and lengths, and numeric moments kept as exact integer sums (see
  ``_NumericAccumulator``). Merging partitions in any order gives bit-identical output.
- **JSON as written.** Output holds only ``int``, ``float``, ``str`` and ``None`` (an
  empty feature has ``null`` statistics, never NaN), so ``manifest.json`` stays strict JSON.
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

import apache_beam as beam

from contracts.dataset_manifest import QUANTILES
from contracts.features import FeatureSpec, token_ids_key

MAX_FREQUENCIES = 1000

# Every finite double is an integer multiple of 2**-1074 (the smallest subnormal), so
# scaling by 2**1074 (and 2**2148 for squares) turns float sums into exact int sums.
_SCALE_BITS = 1074


def _scaled(value: int | float, bits: int) -> tuple[int, int]:
    """``value * 2**bits`` and ``value**2 * 2**(2*bits)`` as exact integers."""
    numerator, denominator = value.as_integer_ratio()
    shift = bits - (denominator.bit_length() - 1)
    return numerator << shift, (numerator * numerator) << (2 * shift)


def _as_number(value: Any) -> int | float | None:
    """A finite Python number, or None for a value no mean could use (NaN, inf, junk)."""
    if isinstance(value, numbers.Integral):
        return int(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def nearest_rank_quantiles(lengths: Counter[int]) -> dict[str, int | None]:
    """Exact quantiles of a multiset of lengths, by the nearest-rank definition.

    The q-th percentile of n sorted values is the value at 1-based rank
    ``max(1, ceil(q / 100 * n))``: always an observed length (no interpolation), p0 is
    the minimum and p100 the maximum. Every key is ``None`` when there are no values.
    """
    total = sum(lengths.values())
    if total == 0:
        return {f"p{q}": None for q in QUANTILES}
    ranks = {f"p{q}": max(1, math.ceil(Fraction(q, 100) * total)) for q in QUANTILES}
    result: dict[str, int | None] = {}
    seen = 0
    pending = sorted(ranks.items(), key=lambda item: item[1])
    for length, occurrences in sorted(lengths.items()):
        seen += occurrences
        while pending and pending[0][1] <= seen:
            result[pending.pop(0)[0]] = length
    return {f"p{q}": result[f"p{q}"] for q in QUANTILES}


class _NumericAccumulator:
    """Count, extremes and the first two moments over every value of a numeric feature.

    The usual mergeable form (Chan et al.'s pairwise update of mean and M2) is stable,
    but its rounding depends on the order bundles are merged in, so two runners could
    publish different statistics for the same data. Exact integer sums of the values
    and their squares (scaled by ``2**1074``) are stable *and* order independent: the
    mean and variance are computed once, from exact numbers, and rounded once.
    """

    def __init__(self) -> None:
        self.count = 0  # records with a value
        self.missing = 0
        self.num_values = 0
        self.scaled_sum = 0
        self.scaled_sum_squares = 0
        self.min: int | float | None = None
        self.max: int | float | None = None

    def add(self, value: Any, record: Mapping[str, Any]) -> None:
        if hasattr(value, "tolist"):
            value = value.tolist()
        values = value if isinstance(value, list | tuple) else [value]
        if value is None or not values:
            self.missing += 1
            return
        self.count += 1
        for raw in values:
            number = _as_number(raw)
            if number is None:
                continue
            scaled, scaled_square = _scaled(number, _SCALE_BITS)
            self.num_values += 1
            self.scaled_sum += scaled
            self.scaled_sum_squares += scaled_square
            self.min = number if self.min is None else min(self.min, number)
            self.max = number if self.max is None else max(self.max, number)

    def merge(self, other: _NumericAccumulator) -> None:
        self.count += other.count
        self.missing += other.missing
        self.num_values += other.num_values
        self.scaled_sum += other.scaled_sum
        self.scaled_sum_squares += other.scaled_sum_squares
        for extreme, pick in (("min", min), ("max", max)):
            mine, theirs = getattr(self, extreme), getattr(other, extreme)
            if theirs is not None:
                setattr(self, extreme, theirs if mine is None else pick(mine, theirs))

    def result(self, spec: FeatureSpec) -> dict[str, Any]:
        stats: dict[str, Any] = {
            "type": "numeric",
            "count": self.count,
            "missing": self.missing,
            "min": None,
            "max": None,
            "mean": None,
            "std": None,
        }
        n = self.num_values
        if n == 0:
            return stats
        as_output = int if spec.dtype == "int64" else float
        # var = (n * sum(x^2) - sum(x)^2) / n^2, exactly, in units of 2**-(2 * 1074).
        variance = Fraction(
            n * self.scaled_sum_squares - self.scaled_sum * self.scaled_sum,
            (n * n) << (2 * _SCALE_BITS),
        )
        stats.update(
            min=as_output(self.min),
            max=as_output(self.max),
            mean=float(Fraction(self.scaled_sum, n << _SCALE_BITS)),
            std=math.sqrt(float(variance)),
        )
        return stats


class _CategoricalAccumulator:
    """Full value counts; the output keeps only the most frequent, the count keeps all."""

    def __init__(self) -> None:
        self.missing = 0
        self.frequencies: Counter[str] = Counter()

    def add(self, value: Any, record: Mapping[str, Any]) -> None:
        if value is None or value == "":
            self.missing += 1  # the Example reader cannot tell "" from absent
            return
        self.frequencies[value if isinstance(value, str) else str(value)] += 1

    def merge(self, other: _CategoricalAccumulator) -> None:
        self.missing += other.missing
        self.frequencies.update(other.frequencies)

    def result(self, spec: FeatureSpec) -> dict[str, Any]:
        # Sort by count, then value, so ties (and the cut at MAX_FREQUENCIES) never
        # depend on the order in which values were first seen.
        ranked = sorted(self.frequencies.items(), key=lambda item: (-item[1], item[0]))
        return {
            "type": "categorical",
            "count": sum(self.frequencies.values()),
            "missing": self.missing,
            "num_distinct": len(self.frequencies),
            "frequencies": dict(ranked[:MAX_FREQUENCIES]),
        }


class _TextAccumulator:
    """Histograms of lengths in characters and in tokens.

    Lengths are small integers, so a Counter of them is bounded by the number of
    distinct lengths rather than the number of records, and quantiles read from it
    are exact rather than sketched.
    """

    def __init__(self, name: str) -> None:
        self.tokens_key = token_ids_key(name)
        self.count = 0
        self.missing = 0
        self.lengths: Counter[int] = Counter()
        self.token_lengths: Counter[int] = Counter()

    def add(self, value: Any, record: Mapping[str, Any]) -> None:
        if value is None:
            self.missing += 1
            return
        self.count += 1
        self.lengths[len(value if isinstance(value, str) else str(value))] += 1
        token_ids = record.get(self.tokens_key)
        if token_ids is not None:
            self.token_lengths[len(token_ids)] += 1

    def merge(self, other: _TextAccumulator) -> None:
        self.count += other.count
        self.missing += other.missing
        self.lengths.update(other.lengths)
        self.token_lengths.update(other.token_lengths)

    def result(self, spec: FeatureSpec) -> dict[str, Any]:
        return {
            "type": "text",
            "count": self.count,
            "missing": self.missing,
            "length_quantiles": nearest_rank_quantiles(self.lengths),
            "token_quantiles": nearest_rank_quantiles(self.token_lengths),
        }


class _ImageAccumulator:
    def __init__(self) -> None:
        self.count = 0
        self.missing = 0

    def add(self, value: Any, record: Mapping[str, Any]) -> None:
        if value is None or len(value) == 0:
            self.missing += 1
        else:
            self.count += 1

    def merge(self, other: _ImageAccumulator) -> None:
        self.count += other.count
        self.missing += other.missing

    def result(self, spec: FeatureSpec) -> dict[str, Any]:
        return {"type": "image", "count": self.count, "missing": self.missing}


_FeatureAccumulator = (
    _NumericAccumulator | _CategoricalAccumulator | _TextAccumulator | _ImageAccumulator
)


def _new_feature_accumulator(spec: FeatureSpec) -> _FeatureAccumulator:
    if spec.type == "numeric":
        return _NumericAccumulator()
    if spec.type == "categorical":
        return _CategoricalAccumulator()
    if spec.type == "text":
        return _TextAccumulator(spec.name)
    if spec.type == "image":
        return _ImageAccumulator()
    raise ValueError(f"feature {spec.name!r}: unknown type {spec.type!r}")


class StatisticsAccumulator:
    """The running statistics of one split: a record count and one accumulator per feature."""

    def __init__(self, features: Mapping[str, FeatureSpec]) -> None:
        self.num_records = 0
        self.features = {name: _new_feature_accumulator(spec) for name, spec in features.items()}


class StatisticsCombineFn(beam.CombineFn):
    """Combine final records (dicts) into the manifest's statistics for one split."""

    def __init__(self, features: Mapping[str, FeatureSpec]) -> None:
        super().__init__()
        self._features = dict(features)
        # Fail at pipeline construction, not on a worker, if a feature type is unknown.
        StatisticsAccumulator(self._features)

    def create_accumulator(self) -> StatisticsAccumulator:
        return StatisticsAccumulator(self._features)

    def add_input(
        self, mutable_accumulator: StatisticsAccumulator, element: Mapping[str, Any]
    ) -> StatisticsAccumulator:
        mutable_accumulator.num_records += 1
        for name, accumulator in mutable_accumulator.features.items():
            accumulator.add(element.get(name), element)
        return mutable_accumulator

    def merge_accumulators(
        self, accumulators: Iterable[StatisticsAccumulator]
    ) -> StatisticsAccumulator:
        merged = self.create_accumulator()
        for accumulator in accumulators:
            merged.num_records += accumulator.num_records
            for name, feature in merged.features.items():
                feature.merge(accumulator.features[name])
        return merged

    def extract_output(self, accumulator: StatisticsAccumulator) -> dict[str, Any]:
        return {
            "num_records": accumulator.num_records,
            "features": {
                name: feature.result(self._features[name])
                for name, feature in accumulator.features.items()
            },
        }


def empty_statistics(features: Mapping[str, FeatureSpec]) -> dict[str, Any]:
    """Statistics of a split without records.

    ``CombinePerKey`` emits nothing for a key it never saw, so a writer fills in empty
    splits with this to keep every split's statistics in the same layout.
    """
    fn = StatisticsCombineFn(features)
    return fn.extract_output(fn.create_accumulator())


class ComputeStatistics(beam.PTransform):
    """``(split, record)`` pairs -> one ``(split, statistics)`` pair per split."""

    def __init__(self, features: Mapping[str, FeatureSpec]) -> None:
        super().__init__()
        self._features = dict(features)

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return pcoll | "CombineStatisticsPerSplit" >> beam.CombinePerKey(
            StatisticsCombineFn(self._features)
        )
