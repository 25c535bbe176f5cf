"""The canary statistics against scipy and against numbers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from ops import stats

INF = math.inf
BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, INF)


def expand(counts: list[int]) -> np.ndarray:
    """Individual observations from per-bucket counts: every one in a bucket is a tie."""
    return np.repeat(np.arange(len(counts), dtype=float), counts)


def cumulative(
    counts: list[float], bounds: tuple[float, ...] = BOUNDS
) -> list[tuple[float, float]]:
    return list(zip(bounds, np.cumsum(counts).tolist(), strict=True))


# --- exact rate tests -------------------------------------------------------------------


def random_tables(count: int, seed: int) -> list[tuple[int, int, int, int]]:
    """(stable events, stable total, canary events, canary total) over the traffic a
    canary sees: a handful of requests at a 1 % step up to many thousands."""
    rng = np.random.default_rng(seed)
    tables = []
    for _ in range(count):
        canary_total = int(rng.choice([3, 10, 40, 100, 500, 3000, 20_000]))
        stable_total = int(rng.choice([5, 50, 760, 5000, 100_000]))
        canary = int(rng.binomial(canary_total, rng.uniform(0, 0.25)))
        stable = int(rng.binomial(stable_total, rng.uniform(0, 0.25)))
        tables.append((stable, stable_total, canary, canary_total))
    return tables


def close(value: float, expected: float) -> bool:
    """Equal to 1e-6 absolute or 1e-3 relative: far finer than any alpha a check uses."""
    return abs(value - expected) <= max(1e-6, 1e-3 * expected)


def test_rate_increase_without_margin_is_fishers_exact_test_on_many_tables() -> None:
    for stable, stable_total, canary, canary_total in random_tables(300, seed=1):
        expected = scipy_stats.fisher_exact(
            [[canary, canary_total - canary], [stable, stable_total - stable]],
            alternative="greater",
        ).pvalue
        result = stats.rate_increase_test(stable, stable_total, canary, canary_total)
        assert close(result.p_value, expected), (stable, stable_total, canary, canary_total)


def test_one_error_among_few_canary_requests_is_weak_evidence() -> None:
    # The case a pooled z-test got wrong by four orders of magnitude (p = 6e-6).
    assert stats.rate_increase_test(0, 760, 1, 40).p_value == pytest.approx(0.05, abs=1e-6)
    assert stats.rate_increase_test(0, 760, 1, 100).p_value > 0.1


@pytest.mark.parametrize(
    ("stable", "canary", "margin"),
    [((10, 1000), (30, 1000), 0.005), ((0, 760), (3, 60), 0.01), ((50, 5000), (9, 300), 0.02)],
)
def test_rate_increase_with_a_margin_is_the_posterior_probability_of_h0(
    stable: tuple[int, int], canary: tuple[int, int], margin: float
) -> None:
    """P(canary rate <= stable rate + margin) under the Fisher-equivalent posteriors,
    estimated independently by sampling them."""
    (xs, ns), (xc, nc) = stable, canary
    rng = np.random.default_rng(7)
    draws = 400_000
    canary_rate = scipy_stats.beta.rvs(xc, nc - xc + 1, size=draws, random_state=rng)
    stable_rate = scipy_stats.beta.rvs(xs + 1, ns - xs, size=draws, random_state=rng)
    expected = float(np.mean(canary_rate <= stable_rate + margin))
    result = stats.rate_increase_test(xs, ns, xc, nc, margin)
    assert result.p_value == pytest.approx(expected, abs=0.003)
    assert result.statistic == pytest.approx(xc / nc - xs / ns - margin)


def test_a_margin_only_ever_weakens_the_evidence() -> None:
    p_values = [stats.rate_increase_test(10, 1000, 30, 1000, m).p_value for m in (0, 0.005, 0.02)]
    assert p_values == sorted(p_values) and p_values[0] < 0.002 < 0.4 < p_values[-1]


def test_fractional_counts_interpolate_between_whole_ones() -> None:
    low = stats.rate_increase_test(5, 1000, 2, 100).p_value
    high = stats.rate_increase_test(5, 1000, 3, 100).p_value
    between = stats.rate_increase_test(5.0, 1000.0, 2.6, 100.0).p_value
    assert high < between < low
    assert (
        stats.binomial_above_test(3, 100, 0.01).p_value
        < stats.binomial_above_test(2.6, 100, 0.01).p_value
        < stats.binomial_above_test(2, 100, 0.01).p_value
    )


def test_a_better_canary_is_never_significant() -> None:
    assert stats.rate_increase_test(50, 1000, 5, 1000).p_value > 0.99


@pytest.mark.parametrize(
    ("stable", "canary"), [((0, 100), (0, 100)), ((100, 100), (50, 50)), ((0, 0), (1, 10))]
)
def test_rate_increase_without_evidence_gives_p_one(
    stable: tuple[float, float], canary: tuple[float, float]
) -> None:
    assert stats.rate_increase_test(*stable, *canary).p_value == 1.0


def test_rate_tests_reject_impossible_counts_and_margins() -> None:
    with pytest.raises(ValueError, match="events <= total"):
        stats.rate_increase_test(11, 10, 0, 10)
    with pytest.raises(ValueError, match="margin"):
        stats.rate_increase_test(1, 10, 0, 10, margin=-0.1)
    with pytest.raises(ValueError, match="proportion"):
        stats.binomial_above_test(1, 10, 1.5)


def test_binomial_above_is_scipys_exact_binomial_test_on_many_cases() -> None:
    rng = np.random.default_rng(3)
    for _ in range(300):
        total = int(rng.choice([1, 10, 50, 400, 5000]))
        limit = float(rng.choice([0.001, 0.01, 0.05, 0.3]))
        events = int(rng.binomial(total, min(1.0, limit * rng.uniform(0.2, 3))))
        expected = scipy_stats.binomtest(events, total, limit, alternative="greater").pvalue
        result = stats.binomial_above_test(events, total, limit)
        assert close(result.p_value, expected), (events, total, limit)


def test_binomial_above_edge_limits() -> None:
    assert stats.binomial_above_test(1, 100, 0.0).p_value == 0.0
    assert stats.binomial_above_test(0, 100, 0.0).p_value == 1.0
    assert stats.binomial_above_test(100, 100, 1.0).p_value == 1.0
    assert stats.binomial_above_test(0, 0, 0.05).p_value == 1.0


# --- multiple comparisons ---------------------------------------------------------------


def test_holm_adjusts_in_step_down_order() -> None:
    # sorted p: 0.01 (x3) -> 0.03, 0.02 (x2) -> 0.04, 0.04 (x1) -> 0.04 (monotone)
    assert stats.holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert stats.holm([]) == []


# --- Mann-Whitney on buckets ----------------------------------------------------------


@pytest.mark.parametrize(
    ("canary", "stable"),
    [
        ([10, 30, 40, 15, 5, 0], [20, 40, 30, 8, 2, 0]),  # canary a little slower
        ([0, 5, 10, 40, 40, 5], [50, 40, 8, 2, 0, 0]),  # canary much slower
        ([50, 40, 8, 2, 0, 0], [0, 5, 10, 40, 40, 5]),  # canary faster
        ([30, 0, 0, 0, 0, 10], [40, 10, 0, 0, 0, 0]),  # heavy ties
        ([7, 7, 7, 7, 7, 7], [7, 7, 7, 7, 7, 7]),  # identical
    ],
)
def test_mann_whitney_buckets_matches_scipy_on_expanded_samples(
    canary: list[int], stable: list[int]
) -> None:
    expected = scipy_stats.mannwhitneyu(
        expand(canary),
        expand(stable),
        alternative="greater",
        method="asymptotic",
        use_continuity=True,
    )
    result = stats.mann_whitney_buckets(canary, stable)
    assert result.statistic == pytest.approx(expected.statistic)
    assert result.p_value == pytest.approx(expected.pvalue, rel=1e-9, abs=1e-15)


def test_mann_whitney_u_by_hand() -> None:
    # canary: one in bucket 1, one in bucket 2; stable: two in bucket 1.
    # pairs canary>stable: bucket-2 obs beats both (2); bucket-1 obs ties both (2 × 0.5) -> U = 3
    result = stats.mann_whitney_buckets([0, 1, 1], [0, 2, 0])
    assert result.statistic == 3.0


def test_mann_whitney_degenerate_inputs_give_no_evidence() -> None:
    assert stats.mann_whitney_buckets([0, 10, 0], [0, 30, 0]).p_value == 1.0  # all tied
    assert stats.mann_whitney_buckets([0, 0, 0], [10, 20, 30]).p_value == 1.0  # no canary data
    # a handful of very slow canary requests: too few to rank, not a slowdown
    assert stats.mann_whitney_buckets([0, 0, 19], [60, 0, 0]).p_value == 1.0
    with pytest.raises(ValueError, match="length"):
        stats.mann_whitney_buckets([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="non-negative"):
        stats.mann_whitney_buckets([1, -2], [1, 2])


def test_mann_whitney_accepts_fractional_counts_from_extrapolated_increases() -> None:
    whole = stats.mann_whitney_buckets([10, 30, 40], [20, 40, 30])
    scaled = stats.mann_whitney_buckets([10.5, 31.5, 42.0], [21.0, 42.0, 31.5])
    assert 0 < scaled.p_value < 1
    assert scaled.p_value < whole.p_value  # more (scaled) evidence, same shape


# --- histogram quantile ----------------------------------------------------------------


def test_histogram_quantile_interpolates_linearly_within_the_bucket() -> None:
    # 100 observations: 50 in (0, 0.005], 40 in (0.005, 0.01], 10 in (0.01, 0.025]
    buckets = cumulative([50, 40, 10, 0, 0, 0])
    # rank 99 falls in the third bucket: 0.01 + 0.015 * (99 - 90) / 10
    assert stats.histogram_quantile(0.99, buckets) == pytest.approx(0.01 + 0.015 * 0.9)
    # rank 25 in the first bucket, lower bound 0: 0.005 * 25 / 50
    assert stats.histogram_quantile(0.25, buckets) == pytest.approx(0.0025)
    # exactly a bucket boundary
    assert stats.histogram_quantile(0.5, buckets) == pytest.approx(0.005)


def test_histogram_quantile_in_the_inf_bucket_returns_the_highest_finite_bound() -> None:
    assert stats.histogram_quantile(0.99, cumulative([10, 0, 0, 0, 0, 90])) == 0.1


def test_histogram_quantile_special_cases_follow_prometheus() -> None:
    assert math.isnan(stats.histogram_quantile(0.99, cumulative([0] * 6)))
    assert math.isnan(stats.histogram_quantile(0.99, [(0.1, 5.0), (1.0, 9.0)]))  # no +Inf
    assert math.isnan(stats.histogram_quantile(0.99, [(INF, 5.0)]))  # one bucket
    assert math.isnan(stats.histogram_quantile(0.99, []))
    assert math.isnan(stats.histogram_quantile(math.nan, cumulative([1] * 6)))
    assert stats.histogram_quantile(-0.1, cumulative([1] * 6)) == -INF
    assert stats.histogram_quantile(1.1, cumulative([1] * 6)) == INF
    assert stats.histogram_quantile(0.5, [(-1.0, 3.0), (0.0, 4.0), (INF, 4.0)]) == -1.0


def test_histogram_quantile_sorts_merges_and_forces_monotonic_counts() -> None:
    shuffled = [(INF, 100.0), (0.01, 90.0), (0.005, 50.0)]
    assert stats.histogram_quantile(0.5, shuffled) == pytest.approx(0.005)
    # a dip (0.01 below 0.005) is lifted to the running maximum, as PromQL does
    dipped = [(0.005, 50.0), (0.01, 40.0), (0.025, 100.0), (INF, 100.0)]
    lifted = [(0.005, 50.0), (0.01, 50.0), (0.025, 100.0), (INF, 100.0)]
    assert stats.histogram_quantile(0.9, dipped) == stats.histogram_quantile(0.9, lifted)
    # duplicate bounds (two series summed without `by (le)` care) are added up
    duplicated = [(0.005, 25.0), (0.005, 25.0), (INF, 100.0)]
    assert stats.bucket_counts(duplicated) == [50.0, 50.0]


def test_fraction_above_is_the_inverse_of_the_quantile() -> None:
    buckets = cumulative([50, 40, 10, 0, 0, 0])
    p99 = stats.histogram_quantile(0.99, buckets)
    above, total = stats.fraction_above(p99, buckets)
    assert total == 100
    assert above == pytest.approx(1.0)
    assert stats.fraction_above(0.0025, buckets)[0] == pytest.approx(75.0)
    assert stats.fraction_above(1.0, cumulative([0, 0, 0, 0, 0, 7]))[0] == 7.0  # +Inf ones


def test_align_buckets_takes_the_lower_bound_count_for_a_missing_bound() -> None:
    left = [(0.01, 5.0), (INF, 10.0)]
    right = [(0.005, 2.0), (0.01, 4.0), (INF, 6.0)]
    aligned_left, aligned_right = stats.align_buckets(left, right)
    assert aligned_left == [(0.005, 0.0), (0.01, 5.0), (INF, 10.0)]
    assert aligned_right == right
