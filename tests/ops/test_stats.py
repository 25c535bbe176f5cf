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


# --- two-proportion z-test ------------------------------------------------------------


def test_two_proportion_z_matches_the_formula_worked_by_hand() -> None:
    # stable 10/1000, canary 30/1000: pooled 0.02, se = sqrt(0.02*0.98*(2/1000)) = 0.0062610
    result = stats.two_proportion_z_test(10, 1000, 30, 1000)
    se = math.sqrt(0.02 * 0.98 * (1 / 1000 + 1 / 1000))
    assert result.statistic == pytest.approx(0.02)
    assert result.z == pytest.approx(0.02 / se)
    assert result.z == pytest.approx(3.1944, abs=1e-4)
    assert result.p_value == pytest.approx(scipy_stats.norm.sf(0.02 / se), rel=1e-12)
    assert result.p_value < 0.001


@pytest.mark.parametrize(
    ("stable", "canary"),
    [
        ((5, 400), (9, 350)),
        ((0, 100), (3, 80)),
        ((12.5, 1000.0), (10.0, 250.0)),
        ((40, 60), (2, 5)),
    ],
)
def test_two_proportion_z_matches_scipy_normal_tail(
    stable: tuple[float, float], canary: tuple[float, float]
) -> None:
    (x1, n1), (x2, n2) = stable, canary
    pooled = (x1 + x2) / (n1 + n2)
    z = (x2 / n2 - x1 / n1) / math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    result = stats.two_proportion_z_test(x1, n1, x2, n2)
    assert result.z == pytest.approx(z)
    assert result.p_value == pytest.approx(scipy_stats.norm.sf(z), rel=1e-9)


def test_a_better_canary_is_never_significant() -> None:
    assert stats.two_proportion_z_test(50, 1000, 5, 1000).p_value > 0.99


@pytest.mark.parametrize(
    ("stable", "canary"), [((0, 100), (0, 100)), ((100, 100), (50, 50)), ((0, 0), (1, 10))]
)
def test_two_proportion_without_variance_or_data_gives_no_evidence(
    stable: tuple[float, float], canary: tuple[float, float]
) -> None:
    assert stats.two_proportion_z_test(*stable, *canary).p_value == 1.0


def test_two_proportion_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError, match="events <= total"):
        stats.two_proportion_z_test(11, 10, 0, 10)


# --- one-sample proportion test -------------------------------------------------------


def test_proportion_above_matches_the_binomial_normal_approximation() -> None:
    # 80 errors in 1000 requests against a 5 % bound: z = 0.03 / sqrt(0.05*0.95/1000)
    result = stats.proportion_above_test(80, 1000, 0.05)
    z = 0.03 / math.sqrt(0.05 * 0.95 / 1000)
    assert result.z == pytest.approx(z)
    assert result.p_value == pytest.approx(scipy_stats.norm.sf(z), rel=1e-9)
    # and it agrees with the exact binomial tail on the decision
    assert scipy_stats.binom.sf(79, 1000, 0.05) < 0.05 and result.p_value < 0.05


def test_proportion_above_edge_limits() -> None:
    assert stats.proportion_above_test(1, 100, 0.0).p_value == 0.0
    assert stats.proportion_above_test(0, 100, 0.0).p_value == 1.0
    assert stats.proportion_above_test(100, 100, 1.0).p_value == 1.0
    assert stats.proportion_above_test(0, 0, 0.05).p_value == 1.0
    with pytest.raises(ValueError, match="proportion"):
        stats.proportion_above_test(1, 10, 1.5)


# --- Mann-Whitney on buckets ----------------------------------------------------------


@pytest.mark.parametrize(
    ("canary", "stable"),
    [
        ([10, 30, 40, 15, 5, 0], [20, 40, 30, 8, 2, 0]),  # canary a little slower
        ([0, 5, 10, 40, 40, 5], [50, 40, 8, 2, 0, 0]),  # canary much slower
        ([50, 40, 8, 2, 0, 0], [0, 5, 10, 40, 40, 5]),  # canary faster
        ([3, 0, 0, 0, 0, 1], [4, 1, 0, 0, 0, 0]),  # few observations, heavy ties
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
    assert stats.mann_whitney_buckets([0, 0, 0], [1, 2, 3]).p_value == 1.0  # no canary data
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
