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

A split's accumulator is bounded whatever its size: numeric moments are sums, and text
lengths are histograms of small integers. Only the values of a categorical feature
can grow with the input (an id-like category), so ``ComputeStatistics`` counts them
per (split, feature, value), spread over the workers, and a bounded combiner keeps
their number and the ``MAX_FREQUENCIES`` most frequent per feature; the split's own
combiner then counts only presence. (``StatisticsCombineFn`` alone, as tests and
tools use it on a few records, still counts the values itself.)
"""

from __future__ import annotations

import heapq
import math
import numbers
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from fractions import Fraction
from typing import Any

import apache_beam as beam

from contracts.dataset_manifest import QUANTILES
from contracts.features import FeatureSpec, plain_numbers
from research.data.categories import frequency_rank
from research.data.records import TOKEN_COUNTS

MAX_FREQUENCIES = 1000

# Every finite double is an integer multiple of 2**-1074 (the smallest subnormal), so
# scaling by 2**1074 (and 2**2148 for squares) turns float sums into exact int sums.
_SCALE_BITS = 1074
# Distinct values a numeric accumulator holds before folding them into its exact sums.
_PENDING_LIMIT = 4096


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


def _finite_plain_numbers(values: list[Any] | tuple[Any, ...]) -> bool:
    """Whether every value is a Python number ``_as_number`` would keep as it is."""
    try:
        return plain_numbers(values) and all(map(math.isfinite, values))
    except OverflowError:  # an int beyond any float: _as_number keeps it, one at a time
        return False


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


class _ExactMoments:
    """The number of values, their sum and the sum of their squares, exactly.

    The usual mergeable form (Chan et al.'s pairwise update of mean and M2) is stable,
    but its rounding depends on the order bundles are merged in, so two runners could
    publish different statistics for the same data. Exact integer sums of the values
    and their squares (scaled by ``2**1074``) are stable *and* order independent: the
    mean and variance are computed once, from exact numbers, and rounded once.
    """

    def __init__(self) -> None:
        self.count = 0
        self.scaled_sum = 0
        self.scaled_sum_squares = 0

    def add(self, number: int | float, occurrences: int = 1) -> None:
        scaled, scaled_square = _scaled(number, _SCALE_BITS)
        self.count += occurrences
        self.scaled_sum += scaled * occurrences
        self.scaled_sum_squares += scaled_square * occurrences

    def merge(self, other: _ExactMoments) -> None:
        self.count += other.count
        self.scaled_sum += other.scaled_sum
        self.scaled_sum_squares += other.scaled_sum_squares

    def mean_std(self) -> dict[str, float | None]:
        n = self.count
        if n == 0:
            return {"mean": None, "std": None}
        # var = (n * sum(x^2) - sum(x)^2) / n^2, exactly, in units of 2**-(2 * 1074).
        variance = Fraction(
            n * self.scaled_sum_squares - self.scaled_sum * self.scaled_sum,
            (n * n) << (2 * _SCALE_BITS),
        )
        return {
            "mean": float(Fraction(self.scaled_sum, n << _SCALE_BITS)),
            "std": math.sqrt(float(variance)),
        }


class _NumericAccumulator:
    """Count, extremes and the first two moments over every value of a numeric feature;
    for a feature a model reads clipped or transformed, the moments of the values as it
    reads them too (``as_model_reads``), which is what it standardizes with.

    Values wait in a Counter (``pending``) before they reach the exact moments: a Counter
    of a vector is filled at C speed, and real features repeat values (pixels, counts,
    rounded measurements), so each distinct value is scaled to an exact integer once per
    ``_PENDING_LIMIT`` rather than once per occurrence.
    """

    def __init__(self, spec: FeatureSpec) -> None:
        self.count = 0  # records with a value
        self.missing = 0
        self.moments = _ExactMoments()
        self.read = _ExactMoments() if spec.reshaped else None
        self.pending: Counter[int | float] = Counter()
        self._spec = spec
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
        if _finite_plain_numbers(values):
            numbers_read = values
        else:
            numbers_read = [n for n in map(_as_number, values) if n is not None]
            if not numbers_read:
                return
        self.pending.update(numbers_read)
        low, high = min(numbers_read), max(numbers_read)
        self.min = low if self.min is None else min(self.min, low)
        self.max = high if self.max is None else max(self.max, high)
        if len(self.pending) > _PENDING_LIMIT:
            self._fold()

    def _fold(self) -> None:
        """Move the pending values into the exact moments."""
        for number, occurrences in self.pending.items():
            self.moments.add(number, occurrences)
            if self.read is not None:
                self.read.add(self._spec.as_model_reads(number), occurrences)
        self.pending.clear()

    def merge(self, other: _NumericAccumulator) -> None:
        self.count += other.count
        self.missing += other.missing
        self.pending.update(other.pending)
        self.moments.merge(other.moments)
        if self.read is not None and other.read is not None:
            self.read.merge(other.read)
        for extreme, pick in (("min", min), ("max", max)):
            mine, theirs = getattr(self, extreme), getattr(other, extreme)
            if theirs is not None:
                setattr(self, extreme, theirs if mine is None else pick(mine, theirs))
        if len(self.pending) > _PENDING_LIMIT:
            self._fold()

    def result(self, spec: FeatureSpec) -> dict[str, Any]:
        self._fold()
        as_output = int if spec.dtype == "int64" else float
        stats: dict[str, Any] = {
            "type": "numeric",
            "count": self.count,
            "missing": self.missing,
            "min": None if self.min is None else as_output(self.min),
            "max": None if self.max is None else as_output(self.max),
            **self.moments.mean_std(),
        }
        if self.read is not None:
            stats["as_read"] = self.read.mean_std()
        return stats


def category(value: Any) -> str | None:
    """A categorical value as the statistics count it; None when missing (the Example
    reader cannot tell "" from absent)."""
    if value is None or value == "":
        return None
    return value if isinstance(value, str) else str(value)


def top_frequencies(value_counts: Iterable[tuple[str, int]]) -> dict[str, int]:
    """The ``MAX_FREQUENCIES`` most frequent values, ties by value, so the cut never
    depends on the order in which values were first seen."""
    return dict(heapq.nsmallest(MAX_FREQUENCIES, value_counts, key=frequency_rank))


class _CategoricalAccumulator:
    """Value counts (when ``count_values``); the output keeps only the most frequent,
    the count keeps all."""

    def __init__(self, count_values: bool) -> None:
        self.count = 0
        self.missing = 0
        self.frequencies: Counter[str] | None = Counter() if count_values else None

    def add(self, value: Any, record: Mapping[str, Any]) -> None:
        value = category(value)
        if value is None:
            self.missing += 1
            return
        self.count += 1
        if self.frequencies is not None:
            self.frequencies[value] += 1

    def merge(self, other: _CategoricalAccumulator) -> None:
        self.count += other.count
        self.missing += other.missing
        if self.frequencies is not None and other.frequencies is not None:
            self.frequencies.update(other.frequencies)

    def result(self, spec: FeatureSpec) -> dict[str, Any]:
        frequencies = self.frequencies or Counter()
        return {
            "type": "categorical",
            "count": self.count,
            "missing": self.missing,
            "num_distinct": len(frequencies),
            "frequencies": top_frequencies(frequencies.items()),
        }


class _TextAccumulator:
    """Histograms of lengths in characters and in tokens.

    Lengths are small integers, so a Counter of them is bounded by the number of
    distinct lengths rather than the number of records, and quantiles read from it
    are exact rather than sketched.
    """

    def __init__(self, name: str) -> None:
        self.name = name
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
        tokens = record.get(TOKEN_COUNTS, {}).get(self.name)
        if tokens is not None:
            self.token_lengths[tokens] += 1

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


def _new_feature_accumulator(spec: FeatureSpec, count_values: bool) -> _FeatureAccumulator:
    if spec.type == "numeric":
        return _NumericAccumulator(spec)
    if spec.type == "categorical":
        return _CategoricalAccumulator(count_values)
    if spec.type == "text":
        return _TextAccumulator(spec.name)
    if spec.type == "image":
        return _ImageAccumulator()
    raise ValueError(f"feature {spec.name!r}: unknown type {spec.type!r}")


class StatisticsAccumulator:
    """The running statistics of one split: a record count and one accumulator per feature."""

    def __init__(self, features: Mapping[str, FeatureSpec], count_values: bool = True) -> None:
        self.num_records = 0
        self.features = {
            name: _new_feature_accumulator(spec, count_values) for name, spec in features.items()
        }


class StatisticsCombineFn(beam.CombineFn):
    """Combine final records (dicts) into the manifest's statistics for one split.

    Without ``count_values``, categorical features report no distinct values and no
    frequencies: ``ComputeStatistics`` fills them in from its own per-value counts.
    """

    def __init__(self, features: Mapping[str, FeatureSpec], count_values: bool = True) -> None:
        super().__init__()
        self._features = dict(features)
        self._count_values = count_values
        # Fail at pipeline construction, not on a worker, if a feature type is unknown.
        StatisticsAccumulator(self._features)

    def create_accumulator(self) -> StatisticsAccumulator:
        return StatisticsAccumulator(self._features, self._count_values)

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
        categorical = [name for name, spec in self._features.items() if spec.type == "categorical"]
        statistics = pcoll | "CombineStatisticsPerSplit" >> beam.CombinePerKey(
            StatisticsCombineFn(self._features, count_values=not categorical)
        )
        if not categorical:
            return statistics
        values = (
            pcoll
            | "CategoricalValues" >> beam.FlatMap(_categorical_values, categorical)
            | "CountValues" >> beam.CombinePerKey(sum)
            | "ByFeature" >> beam.MapTuple(lambda key, count: (key[:2], (key[2], count)))
            | "DistinctValues" >> beam.CombinePerKey(DistinctValuesCombineFn())
            | "BySplit" >> beam.MapTuple(lambda key, found: (key[0], (key[1], found)))
        )
        return (
            {"statistics": statistics, "values": values}
            | "JoinValues" >> beam.CoGroupByKey()
            | "WithValues" >> beam.MapTuple(_with_values)
        )


def _categorical_values(
    item: tuple[str, Mapping[str, Any]], names: list[str]
) -> Iterator[tuple[tuple[str, str, str], int]]:
    split, record = item
    for name in names:
        value = category(record.get(name))
        if value is not None:
            yield (split, name, value), 1


class DistinctValuesCombineFn(beam.CombineFn):
    """``(value, count)`` pairs, one per distinct value -> ``(number of values, the
    MAX_FREQUENCIES most frequent as [value, count] pairs)``, in bounded memory."""

    def create_accumulator(self) -> tuple[int, list[tuple[str, int]]]:
        return 0, []

    def add_input(
        self, accumulator: tuple[int, list[tuple[str, int]]], element: tuple[str, int]
    ) -> tuple[int, list[tuple[str, int]]]:
        distinct, top = accumulator
        top.append(element)
        if len(top) >= 2 * MAX_FREQUENCIES:
            top = list(top_frequencies(top).items())
        return distinct + 1, top

    def merge_accumulators(
        self, accumulators: Iterable[tuple[int, list[tuple[str, int]]]]
    ) -> tuple[int, list[tuple[str, int]]]:
        distinct, tops = 0, []
        for count, top in accumulators:
            distinct += count
            tops.extend(top)
        return distinct, list(top_frequencies(tops).items())

    def extract_output(
        self, accumulator: tuple[int, list[tuple[str, int]]]
    ) -> tuple[int, list[tuple[str, int]]]:
        distinct, top = accumulator
        return distinct, list(top_frequencies(top).items())


def _with_values(split: str, joined: dict[str, Iterable[Any]]) -> tuple[str, dict[str, Any]]:
    """The split's statistics with each categorical feature's distinct values filled in."""
    (statistics,) = joined["statistics"]
    features = dict(statistics["features"])
    for name, (distinct, top) in joined["values"]:
        features[name] = {**features[name], "num_distinct": distinct, "frequencies": dict(top)}
    return split, {**statistics, "features": features}
