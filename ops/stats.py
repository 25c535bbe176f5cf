"""The statistics behind a canary verdict, on the aggregated counts metrics give us.

A gateway never exports individual requests, only counters and histogram buckets, so
every test here works on counts: proportions for error, failover and misclassification
rates, bucketed latencies for the rank test, Prometheus' own interpolation for quantiles.

Rates are tested exactly, because a canary at 1 % of traffic has few requests and a
normal approximation there is wildly overconfident (1 error in 40 requests against 0 in
760 is p = 6e-6 under a pooled z-test, p = 0.05 under Fisher's exact test):

- against stable: ``rate_increase_test``, Fisher's exact test generalised to a margin;
- against a fixed limit: ``binomial_above_test``, the exact one-sample binomial test.

Counts may be fractional (Prometheus' ``increase()`` extrapolates to the window's edges).
Both tests are written with the regularized incomplete beta function, whose parameters
are real: at whole counts it gives exactly the classical tests, between them it
interpolates smoothly and monotonically, so 2.6 errors are judged between 2 and 3 rather
than rounded to either.

Everything is one-sided ("is the canary worse?"), because a canary that is better than
stable is never a reason to roll back. Multiple checks of one analysis are corrected
together with ``holm``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

Buckets = Sequence[tuple[float, float]]
"""``(le, cumulative count)`` pairs, as a Prometheus histogram exposes them."""

MIN_RANK_SAMPLES = 20
"""Observations each side needs before the rank test's normal approximation is trusted."""


def _quantile_rule(count: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes and weights for an integral over posterior quantiles u in [0, 1].

    The quantile function is steep near 0 and 1, so the nodes are pulled towards the ends
    with u = 3t² - 2t³; 96 of them match Fisher's test to ~1e-6 relative where a verdict
    is decided, at a fraction of the cost of adaptive quadrature (the benchmark judges
    hundreds of thousands of measurements).
    """
    nodes, weights = np.polynomial.legendre.leggauss(count)
    t, weights = (nodes + 1) / 2, weights / 2
    return t * t * (3 - 2 * t), weights * 6 * t * (1 - t)


_NODES, _WEIGHTS = _quantile_rule(96)


@dataclass(frozen=True)
class TestResult:
    """A one-sided test: ``statistic`` in the test's own units and its p-value."""

    __test__ = False  # not a pytest test class, despite the name

    statistic: float
    p_value: float


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z; erfc keeps precision far in the tail."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def rate_increase_test(
    stable_events: float,
    stable_total: float,
    canary_events: float,
    canary_total: float,
    margin: float = 0.0,
) -> TestResult:
    """Is the canary's event rate more than ``margin`` above stable's? (exact, one-sided)

    H0: canary rate <= stable rate + margin. The p-value is the probability of H0 under
    the posteriors Beta(canary events, canary non-events + 1) and Beta(stable events + 1,
    stable non-events): by Altham's theorem (1969) this is exactly the one-sided p-value
    of Fisher's exact test when the margin is 0, and it extends that test to a
    non-inferiority margin and to fractional counts. ``statistic`` is the observed
    difference of rates minus the margin. With no traffic on a side there is no evidence:
    p = 1.
    """
    _check_counts(stable_events, stable_total)
    _check_counts(canary_events, canary_total)
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be a proportion in [0, 1), got {margin}")
    if stable_total == 0 or canary_total == 0:
        return TestResult(0.0, 1.0)
    difference = canary_events / canary_total - stable_events / stable_total - margin
    canary = (canary_events, canary_total - canary_events + 1)
    stable = (stable_events + 1, stable_total - stable_events)
    if canary[0] == 0 or stable[1] == 0:  # canary surely at 0 %, or stable surely at 100 %
        return TestResult(difference, 1.0)
    # Integrate over the quantiles of the narrower posterior, so the other one's CDF is
    # evaluated where it is smooth: P(canary <= stable + margin).
    if sum(stable) >= sum(canary):
        above = np.clip(special.betaincinv(*stable, _NODES) + margin, 0, 1)
        inner = special.betainc(*canary, above)
    else:
        below = np.clip(special.betaincinv(*canary, _NODES) - margin, 0, 1)
        inner = special.betaincc(*stable, below)
    return TestResult(difference, float(np.clip(np.dot(_WEIGHTS, inner), 0.0, 1.0)))


def binomial_above_test(events: float, total: float, limit: float) -> TestResult:
    """Is the true event rate above ``limit``? (exact one-sample binomial test)

    H0: rate <= limit; the p-value is P(X >= events) for X ~ Binomial(total, limit),
    written as the regularized incomplete beta I_limit(events, total - events + 1) so
    fractional counts interpolate. Used for absolute bounds ("at most 5 % errors"): one
    bad minute of a handful of requests is not proof that the bound is broken. A limit
    of 0 tolerates nothing, so any event is conclusive; a limit of 1 can never be
    exceeded. ``statistic`` is the observed rate minus the limit.
    """
    _check_counts(events, total)
    if not 0 <= limit <= 1:
        raise ValueError(f"limit must be a proportion in [0, 1], got {limit}")
    if total == 0:
        return TestResult(0.0, 1.0)
    difference = events / total - limit
    if events == 0 or limit == 1:
        return TestResult(difference, 1.0)
    if limit == 0:
        return TestResult(difference, 0.0)
    return TestResult(difference, float(special.betainc(events, total - events + 1, limit)))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the order given: reject where adjusted < alpha.

    Holm's step-down procedure keeps the chance of any false rejection among the checks of
    one analysis at alpha whatever their dependence, and is uniformly more powerful than
    Bonferroni. Adjusted p_(i) = max over j <= i of min(1, (m - j + 1) p_(j)).
    """
    order = sorted(range(len(p_values)), key=lambda index: p_values[index])
    adjusted = [1.0] * len(p_values)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


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
        return TestResult(0.0, 1.0)
    u = 0.0
    stable_below = 0.0
    tie_term = 0.0
    for canary_count, stable_count in zip(canary, stable, strict=True):
        u += canary_count * (stable_below + 0.5 * stable_count)
        stable_below += stable_count
        tied = canary_count + stable_count
        tie_term += tied**3 - tied
    if min(n_canary, n_stable) < MIN_RANK_SAMPLES:
        return TestResult(u, 1.0)
    n = n_canary + n_stable
    mean = n_canary * n_stable / 2
    variance = n_canary * n_stable / 12 * ((n + 1) - tie_term / (n * (n - 1)))
    if variance <= 0:  # every observation in one bucket: nothing to rank
        return TestResult(u, 1.0)
    return TestResult(u, normal_sf((u - mean - 0.5) / math.sqrt(variance)))


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
    proportion that ``binomial_above_test`` can test. Observations in the ``+Inf``
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
