"""The statistics behind a canary verdict, on the aggregated counts metrics give us.

A gateway never exports individual requests, only counters and histogram buckets, so
every test here works on counts: proportions for error and failover rates, bucketed
latencies for the rank test, Prometheus' own interpolation for quantiles. Counts may be
fractional (Prometheus' ``increase()`` extrapolates); the formulas accept that.

Everything is one-sided ("is the canary worse?"), because a canary that is better than
stable is never a reason to roll back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Buckets = Sequence[tuple[float, float]]
"""``(le, cumulative count)`` pairs, as a Prometheus histogram exposes them."""


@dataclass(frozen=True)
class TestResult:
    """A one-sided test: ``statistic`` in the test's own units, ``z`` the standardised one."""

    __test__ = False  # not a pytest test class, despite the name

    statistic: float
    z: float
    p_value: float


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z; erfc keeps precision far in the tail."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def two_proportion_z_test(
    stable_events: float, stable_total: float, canary_events: float, canary_total: float
) -> TestResult:
    """Does the canary have a higher event rate than stable? (pooled two-proportion z-test)

    The pooled proportion is used for the standard error because the null hypothesis is
    that both rates are equal. With no variance at all (no events anywhere, or only
    events) there is no evidence either way: p = 1.
    """
    _check_counts(stable_events, stable_total)
    _check_counts(canary_events, canary_total)
    if stable_total == 0 or canary_total == 0:
        return TestResult(0.0, 0.0, 1.0)
    stable_rate = stable_events / stable_total
    canary_rate = canary_events / canary_total
    pooled = (stable_events + canary_events) / (stable_total + canary_total)
    variance = pooled * (1 - pooled) * (1 / stable_total + 1 / canary_total)
    difference = canary_rate - stable_rate
    if variance <= 0:
        return TestResult(difference, 0.0, 1.0)
    z = difference / math.sqrt(variance)
    return TestResult(difference, z, normal_sf(z))


def proportion_above_test(events: float, total: float, limit: float) -> TestResult:
    """Is the true event rate above ``limit``? (one-sample z-test against a fixed rate)

    Used for absolute bounds ("at most 5 % errors"): one bad minute of a handful of
    requests should not count as proof that the bound is broken. A limit of 0 tolerates
    nothing, so any event is conclusive; a limit of 1 can never be exceeded.
    """
    _check_counts(events, total)
    if not 0 <= limit <= 1:
        raise ValueError(f"limit must be a proportion in [0, 1], got {limit}")
    if total == 0:
        return TestResult(0.0, 0.0, 1.0)
    rate = events / total
    difference = rate - limit
    if limit in (0.0, 1.0):
        exceeded = difference > 0
        return TestResult(difference, math.inf if exceeded else 0.0, 0.0 if exceeded else 1.0)
    z = difference / math.sqrt(limit * (1 - limit) / total)
    return TestResult(difference, z, normal_sf(z))


def mann_whitney_buckets(canary: Sequence[float], stable: Sequence[float]) -> TestResult:
    """Are canary observations stochastically larger than stable ones? (one-sided U test)

    ``canary`` and ``stable`` are per-bucket (not cumulative) counts over the same bucket
    bounds. All observations within one bucket are ties, which is exactly what a bucketed
    histogram knows about them. The statistic is the canary's U (pairs where the canary
    is slower, ties counting half); the p-value is the normal approximation with tie
    correction and continuity correction, as ``scipy.stats.mannwhitneyu(canary, stable,
    alternative="greater", method="asymptotic")`` computes it on the expanded samples.
    """
    if len(canary) != len(stable):
        raise ValueError(f"bucket counts differ in length: {len(canary)} vs {len(stable)}")
    for count in (*canary, *stable):
        if count < 0 or math.isnan(count):
            raise ValueError(f"bucket counts must be non-negative, got {count}")
    n_canary, n_stable = float(sum(canary)), float(sum(stable))
    if n_canary == 0 or n_stable == 0:
        return TestResult(0.0, 0.0, 1.0)
    u = 0.0
    stable_below = 0.0
    tie_term = 0.0
    for canary_count, stable_count in zip(canary, stable, strict=True):
        u += canary_count * (stable_below + 0.5 * stable_count)
        stable_below += stable_count
        tied = canary_count + stable_count
        tie_term += tied**3 - tied
    n = n_canary + n_stable
    mean = n_canary * n_stable / 2
    variance = n_canary * n_stable / 12 * ((n + 1) - tie_term / (n * (n - 1)))
    if variance <= 0:  # every observation in one bucket: nothing to rank
        return TestResult(u, 0.0, 1.0)
    z = (u - mean - 0.5) / math.sqrt(variance)
    return TestResult(u, z, normal_sf(z))


def histogram_quantile(q: float, buckets: Buckets) -> float:
    """The ``q`` quantile of a bucketed histogram, exactly as PromQL's ``histogram_quantile``.

    Linear interpolation within the bucket holding the rank, 0 as the lower bound of the
    first bucket when that bound is positive, the highest finite bound when the rank
    falls in the ``+Inf`` bucket. NaN when the histogram is empty, lacks a ``+Inf``
    bucket, or has fewer than two buckets, like Prometheus; counts that decrease with
    ``le`` are lifted to the running maximum first, like Prometheus.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    cumulative = _normalise(buckets)
    if not cumulative or not math.isinf(cumulative[-1][0]) or len(cumulative) < 2:
        return math.nan
    observations = cumulative[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    index = len(cumulative) - 1
    for position, (_, count) in enumerate(cumulative[:-1]):
        if count >= rank:
            index = position
            break
    if index == len(cumulative) - 1:
        return cumulative[-2][0]
    upper, count = cumulative[index]
    if index == 0 and upper <= 0:
        return upper
    lower = 0.0
    if index > 0:
        lower, below = cumulative[index - 1]
        count -= below
        rank -= below
    if count == 0:  # q == 0 over an empty lowest bucket: 0/0 in PromQL too
        return math.nan
    return lower + (upper - lower) * (rank / count)


def fraction_above(threshold: float, buckets: Buckets) -> tuple[float, float]:
    """``(observations above threshold, all observations)``, interpolating like the quantile.

    The inverse of ``histogram_quantile``: the p99 is above ``threshold`` exactly when
    more than 1 % of the observations are, which turns an absolute latency bound into a
    proportion that ``proportion_above_test`` can test. Observations in the ``+Inf``
    bucket are all above any finite threshold beyond the highest bound.
    """
    cumulative = _normalise(buckets)
    if not cumulative or not math.isinf(cumulative[-1][0]):
        return 0.0, 0.0
    total = cumulative[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in cumulative:
        if threshold < upper:
            if math.isinf(upper) or threshold <= lower:
                at_or_below = below
            else:
                at_or_below = below + (count - below) * (threshold - lower) / (upper - lower)
            return total - at_or_below, total
        lower, below = upper, count
    return 0.0, total


def bucket_counts(buckets: Buckets) -> list[float]:
    """Per-bucket counts from cumulative ones (after the same clean-up as the quantile)."""
    counts, previous = [], 0.0
    for _, cumulative in _normalise(buckets):
        counts.append(cumulative - previous)
        previous = cumulative
    return counts


def align_buckets(
    first: Buckets, second: Buckets
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Both histograms over the union of their bounds, so their buckets can be compared.

    Two versions normally share bounds (one metric definition), but a gateway upgrade can
    change them. A bound missing on one side gets that side's cumulative count at the next
    lower bound it has: every observation counted there is certainly at or below it.
    """
    left, right = _normalise(first), _normalise(second)
    bounds = sorted({bound for bound, _ in left} | {bound for bound, _ in right})
    return _step(left, bounds), _step(right, bounds)


def _step(cumulative: list[tuple[float, float]], bounds: list[float]) -> list[tuple[float, float]]:
    result, index, count = [], 0, 0.0
    for bound in bounds:
        while index < len(cumulative) and cumulative[index][0] <= bound:
            count = cumulative[index][1]
            index += 1
        result.append((bound, count))
    return result


def _normalise(buckets: Buckets) -> list[tuple[float, float]]:
    """Sorted by bound, duplicate bounds merged, counts made non-decreasing (as PromQL does)."""
    merged: dict[float, float] = {}
    for bound, count in buckets:
        merged[float(bound)] = merged.get(float(bound), 0.0) + float(count)
    result, highest = [], 0.0
    for bound in sorted(merged):
        highest = max(highest, merged[bound])
        result.append((bound, highest))
    return result


def _check_counts(events: float, total: float) -> None:
    if total < 0 or events < 0 or events > total or math.isnan(events) or math.isnan(total):
        raise ValueError(f"need 0 <= events <= total, got {events} of {total}")
