"""Canary verdicts on hand-made measurements, and the analysis file."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from contracts.yaml_config import ConfigError
from ops import stats
from ops.analysis import (
    SUGGESTIVE_P,
    AnalysisConfig,
    format_duration,
    judge,
    load_analysis,
    parse_duration,
    render,
    template_variables,
)
from ops.measurement import Measurement, SideMeasurement
from serving.metrics import GatewayMetrics

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rollouts" / "analysis.yaml"
# The analysis takes whatever bounds a histogram has; these round ones keep the cases legible.
BOUNDS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5,
    10,
    math.inf,
)
FAST = {0.005: 1.0}  # every request in the (2.5 ms, 5 ms] bucket


def latency(shares: dict[float, float], total: float) -> tuple[tuple[float, float], ...]:
    """Cumulative buckets for ``total`` requests spread over bucket bounds by ``shares``."""
    running, buckets = 0.0, []
    for bound in BOUNDS:
        running += shares.get(bound, 0.0) * total
        buckets.append((bound, running))
    return tuple(buckets)


def side(
    version: int,
    requests: float,
    errors: float = 0,
    shares: dict[float, float] | None = None,
    failovers: float = 0,
) -> SideMeasurement:
    return SideMeasurement(version, requests, errors, latency(shares or FAST, requests), failovers)


def measure(
    stable: SideMeasurement,
    canary: SideMeasurement,
    *,
    agreement: float | None = None,
    compared: float = 0,
    custom: dict[str, float | None] | None = None,
) -> Measurement:
    return Measurement(
        "digits", 30.0, stable, canary, agreement, compared, custom or {}, 1_700_000_000.0
    )


DEFAULT = AnalysisConfig()


def check(verdict, name: str):
    (found,) = [result for result in verdict.checks if result.name == name]
    return found


# --- outcomes ------------------------------------------------------------------------


def test_no_canary_traffic_is_no_data() -> None:
    verdict = judge(measure(side(1, 5000), side(2, 0)), DEFAULT)
    assert verdict.outcome == "no_data"
    assert "version 2" in verdict.message


def test_a_healthy_canary_passes_every_check() -> None:
    verdict = judge(measure(side(1, 10_000, 50), side(2, 1000, 5, failovers=1)), DEFAULT)
    assert verdict.outcome == "pass", verdict.message
    assert {result.name for result in verdict.checks} == {
        "error_rate",
        "latency_p99",
        "failover_rate",
        "accuracy",
    }
    assert check(verdict, "accuracy").skipped  # no labels came back: not judged
    assert all(result.passed is True for result in verdict.checks if not result.skipped)
    assert check(verdict, "error_rate").canary == pytest.approx(0.005)


def test_a_blip_on_few_requests_neither_fails_nor_passes() -> None:
    # half of 10 canary requests failed: alarming, but 10 < min_requests
    verdict = judge(measure(side(1, 10_000, 50), side(2, 10, 5)), DEFAULT)
    assert verdict.outcome == "inconclusive"
    assert "10 of 30 canary requests" in verdict.message
    assert all(result.passed is None for result in verdict.checks)
    # and a perfect blip does not pass either
    assert judge(measure(side(1, 10_000, 50), side(2, 10)), DEFAULT).outcome == "inconclusive"


def test_a_significantly_worse_error_rate_fails() -> None:
    # stable 0.5 %, canary 4 %: above stable + 0.5 points, and the exact test says so
    verdict = judge(measure(side(1, 10_000, 50), side(2, 1000, 40)), DEFAULT)
    assert verdict.outcome == "fail"
    result = check(verdict, "error_rate")
    assert result.passed is False
    assert result.limit == pytest.approx(0.01)
    # four bounds tested (error rate x2, latency, failovers): Holm multiplies the smallest by 4
    raw = stats.rate_increase_test(50, 10_000, 40, 1000, margin=0.005).p_value
    assert result.p_value == pytest.approx(4 * raw)
    assert "Holm-adjusted over 4 tests" in result.message
    assert result.p_value < 0.01
    assert "error_rate" in verdict.message


def test_an_error_rate_above_the_bound_without_significance_holds() -> None:
    # stable 0.5 %, canary 6 errors in 200 (3 %) > 1 % bound: Holm-adjusted p ≈ 0.13,
    # leaning towards a violation without proving it
    verdict = judge(measure(side(1, 1000, 5), side(2, 200, 6)), DEFAULT)
    result = check(verdict, "error_rate")
    assert result.canary > result.limit
    assert result.passed is None and 0.01 < result.p_value < 0.5
    assert verdict.outcome == "inconclusive"
    assert "not significant yet" in verdict.message


def test_an_excess_that_chance_alone_explains_passes() -> None:
    # 1 error in 60 (1.7 %) is past stable's 0.5 % + 0.5 points, but the corrected p is 1:
    # holding on it would restart the bake of every good canary at a low step
    verdict = judge(measure(side(1, 1000, 5), side(2, 60, 1)), DEFAULT)
    result = check(verdict, "error_rate")
    assert result.canary > result.limit
    assert result.passed is True and result.p_value >= SUGGESTIVE_P
    assert "by chance alone" in result.message
    assert verdict.outcome == "pass"


def test_the_absolute_error_bound_fails_even_when_stable_is_as_bad() -> None:
    # stable 8 %, canary 8 %: no worse than stable, but above the 5 % absolute max
    verdict = judge(measure(side(1, 10_000, 800), side(2, 1000, 80)), DEFAULT)
    result = check(verdict, "error_rate")
    assert verdict.outcome == "fail"
    assert "max 5.00%" in result.message
    raw = stats.binomial_above_test(80, 1000, 0.05).p_value
    assert result.p_value == pytest.approx(4 * raw)  # Holm over four bounds


def test_the_absolute_error_bound_needs_confidence_too() -> None:
    # 9 errors in 100 (9 %) > 5 %, but the adjusted p ≈ 0.19: hold, do not roll back
    config = AnalysisConfig(checks={"error_rate": {"max_increase_points": None, "max": 0.05}})
    verdict = judge(measure(side(1, 10_000, 0), side(2, 100, 9)), config)
    assert check(verdict, "error_rate").passed is None
    assert verdict.outcome == "inconclusive"


def test_a_significantly_slower_canary_fails_latency() -> None:
    slow = {0.005: 0.5, 0.025: 0.3, 0.1: 0.2}
    verdict = judge(measure(side(1, 5000), side(2, 1000, shares=slow)), DEFAULT)
    result = check(verdict, "latency_p99")
    assert verdict.outcome == "fail"
    assert result.passed is False
    assert result.stable == pytest.approx(
        stats.histogram_quantile(0.99, latency(FAST, 5000)) * 1000
    )
    assert result.canary == pytest.approx(97.5)  # 0.05 + 0.05 * (990 - 800) / 200 seconds
    assert result.limit == pytest.approx(result.stable * 1.2 + 5)
    assert result.p_value < 1e-6


def test_a_slow_tail_of_one_request_is_not_a_latency_failure() -> None:
    # A fast model: every stable request in one bucket. One of 60 canary requests took
    # 100 ms, so the canary p99 jumps far above the bound. Nearly all observations tie, so
    # the rank test alone calls that significant; the tail test (1 of 60 slow is no
    # evidence that more than 1 % are) keeps it a blip that chance explains.
    stable, canary = side(1, 1000), side(2, 60, shares={0.005: 59 / 60, 0.1: 1 / 60})
    rank_only = stats.mann_whitney_buckets(
        stats.bucket_counts(canary.latency_buckets), stats.bucket_counts(stable.latency_buckets)
    )
    assert rank_only.p_value < 0.05
    verdict = judge(measure(stable, canary), DEFAULT)
    result = check(verdict, "latency_p99")
    assert result.canary > result.limit
    assert result.passed is True and result.p_value >= SUGGESTIVE_P
    assert verdict.outcome == "pass"
    # the same tail on 2000 requests (20 slow ones, 1 %) is still within the quantile...
    bigger = side(2, 2000, shares={0.005: 0.99, 0.1: 0.01})
    assert judge(measure(stable, bigger), DEFAULT).outcome == "pass"
    # ...while 5 % slow ones are a real regression
    worse = side(2, 2000, shares={0.005: 0.95, 0.1: 0.05})
    assert judge(measure(stable, worse), DEFAULT).outcome == "fail"


def test_the_absolute_latency_bound_fails_a_canary_as_slow_as_stable() -> None:
    slow = {0.005: 0.9, 0.1: 0.1}  # 10 % of requests between 50 and 100 ms: p99 = 95 ms
    config = AnalysisConfig(checks={"latency_p99": {"max_ms": 50}})
    verdict = judge(measure(side(1, 5000, shares=slow), side(2, 1000, shares=slow)), config)
    result = check(verdict, "latency_p99")
    assert verdict.outcome == "fail"
    assert "max 50 ms" in result.message
    assert result.limit == 50


def test_failovers_count_against_the_canary() -> None:
    verdict = judge(measure(side(1, 10_000), side(2, 1000, failovers=50)), DEFAULT)
    result = check(verdict, "failover_rate")
    assert verdict.outcome == "fail"
    assert result.canary == pytest.approx(0.05)
    assert result.limit == pytest.approx(0.005)  # stable's error rate (0) + 0.5 points


def test_failovers_at_stables_own_error_rate_are_not_a_failure() -> None:
    # A 2.4 % base error rate: a canary failing over as often as stable fails is as good
    # as stable (a fixed 1 % limit rolled such canaries back).
    stable, canary = side(1, 20_000, 480), side(2, 2000, 48, failovers=48)
    verdict = judge(measure(stable, canary), DEFAULT)
    result = check(verdict, "failover_rate")
    assert result.passed is True and result.limit == pytest.approx(0.029)
    assert verdict.outcome == "pass", verdict.message


def test_at_full_weight_relative_checks_are_skipped_and_absolute_ones_decide() -> None:
    verdict = judge(measure(side(1, 0), side(2, 1000, 5)), DEFAULT)
    assert verdict.outcome == "pass", verdict.message
    latency_result = check(verdict, "latency_p99")
    assert latency_result.skipped and latency_result.passed is None
    assert check(verdict, "error_rate").passed is True


def test_shadow_agreement_judges_a_canary_that_only_receives_mirrored_traffic() -> None:
    stable, canary = side(1, 5000), side(2, 0)
    passing = judge(measure(stable, canary, agreement=0.97, compared=200), DEFAULT)
    assert passing.outcome == "pass"
    assert [result.name for result in passing.checks] == ["shadow_agreement"]
    failing = judge(measure(stable, canary, agreement=0.80, compared=200), DEFAULT)
    assert failing.outcome == "fail"
    assert "below min 95.00%" in failing.message
    few = judge(measure(stable, canary, agreement=0.5, compared=20), DEFAULT)
    assert few.outcome == "inconclusive"
    assert "20 of 30 shadow comparisons" in few.message


def test_a_few_trailing_shadow_comparisons_do_not_hold_a_progressing_canary() -> None:
    verdict = judge(measure(side(1, 5000), side(2, 1000), agreement=0.1, compared=3), DEFAULT)
    assert verdict.outcome == "pass"
    assert check(verdict, "shadow_agreement").skipped


def test_custom_checks_bound_their_value_and_skip_when_it_is_missing() -> None:
    config = AnalysisConfig(
        checks={"custom": [{"name": "queue_depth", "query": 'max(q{model="{model}"})', "max": 4}]}
    )
    stable, canary = side(1, 5000), side(2, 1000)
    assert judge(measure(stable, canary, custom={"queue_depth": 2.0}), config).outcome == "pass"
    failing = judge(measure(stable, canary, custom={"queue_depth": 9.0}), config)
    assert failing.outcome == "fail" and "queue_depth 9 above max 4" in failing.message
    skipped = judge(measure(stable, canary, custom={}), config)
    assert skipped.outcome == "pass"
    assert check(skipped, "queue_depth").skipped


def test_a_check_set_to_null_is_not_run() -> None:
    config = AnalysisConfig(checks={"error_rate": None, "failover_rate": None})
    verdict = judge(measure(side(1, 10_000, 50), side(2, 1000, 500)), config)
    assert [result.name for result in verdict.checks] == ["latency_p99", "accuracy"]
    assert verdict.outcome == "pass"


def test_judge_is_deterministic() -> None:
    sample = measure(side(1, 10_000, 50), side(2, 1000, 40))
    assert judge(sample, DEFAULT) == judge(sample, DEFAULT)


def labelled(side_measurement: SideMeasurement, labels: float, correct: float) -> SideMeasurement:
    return replace(side_measurement, labelled=labels, correct=correct)


def test_one_error_in_a_small_canary_window_is_not_a_failure() -> None:
    # 1 error in 60 canary requests against 0 in 760: a pooled z-test called it p = 6e-6
    verdict = judge(measure(side(1, 760), side(2, 60, 1)), DEFAULT)
    assert verdict.outcome != "fail", verdict.message
    assert check(verdict, "error_rate").p_value > 0.05


def test_a_canary_as_bad_as_stable_is_within_the_margin() -> None:
    # both at 3 %: non-inferiority asks for evidence of stable + 0.5 points, not equality
    verdict = judge(measure(side(1, 20_000, 600), side(2, 5000, 150)), DEFAULT)
    assert check(verdict, "error_rate").passed is True
    assert verdict.outcome == "pass", verdict.message


def test_holm_needs_stronger_evidence_as_checks_are_added() -> None:
    # raw p of the error bound between alpha/4 and alpha: alone it fails, with three more
    # bounds in the same analysis Holm holds it as inconclusive.
    stable, canary = side(1, 20_000, 200), side(2, 2000, 46)
    raw = stats.rate_increase_test(200, 20_000, 46, 2000, margin=0.005).p_value
    assert 0.01 / 4 < raw < 0.01
    alone = AnalysisConfig(
        checks={"error_rate": {"max": None}, "latency_p99": None, "failover_rate": None}
    )
    assert judge(measure(stable, canary), alone).outcome == "fail"
    verdict = judge(measure(stable, canary), DEFAULT)
    assert verdict.outcome == "inconclusive"
    assert check(verdict, "error_rate").p_value == pytest.approx(4 * raw)


def test_accuracy_is_judged_once_both_sides_have_enough_labels() -> None:
    stable = labelled(side(1, 10_000), 2000, 1800)  # 90 %
    good = labelled(side(2, 1000), 400, 356)  # 89 %: within 2 points
    verdict = judge(measure(stable, good), DEFAULT)
    result = check(verdict, "accuracy")
    assert result.passed is True and verdict.outcome == "pass"
    assert (result.stable, result.canary) == (pytest.approx(0.9), pytest.approx(0.89))
    assert result.limit == pytest.approx(0.88)
    bad = labelled(side(2, 1000), 400, 320)  # 80 %
    failing = judge(measure(stable, bad), DEFAULT)
    assert failing.outcome == "fail"
    assert "accuracy 80.00% (stable 90.00%) below stable - 2 points" in failing.message
    raw = stats.rate_increase_test(200, 2000, 80, 400, margin=0.02).p_value
    assert check(failing, "accuracy").p_value == pytest.approx(5 * raw)  # Holm over 5 bounds


def test_accuracy_past_the_bound_on_little_evidence_holds() -> None:
    stable = labelled(side(1, 10_000), 2000, 1800)
    canary = labelled(side(2, 1000), 120, 95)  # 79 %: past the 88 % floor, adjusted p ≈ 0.03
    verdict = judge(measure(stable, canary), DEFAULT)
    assert check(verdict, "accuracy").passed is None
    assert verdict.outcome == "inconclusive"


def test_accuracy_without_enough_labels_is_skipped_and_never_holds() -> None:
    stable = labelled(side(1, 10_000), 2000, 1800)
    canary = labelled(side(2, 1000), 30, 3)  # terrible, but only 30 labels
    verdict = judge(measure(stable, canary), DEFAULT)
    result = check(verdict, "accuracy")
    assert result.skipped and "30 canary and 2000 stable labels, 100 each needed" in result.message
    assert verdict.outcome == "pass"


def test_a_latency_baseline_needs_min_requests_stable_observations() -> None:
    slow = {0.005: 0.5, 0.1: 0.5}
    verdict = judge(measure(side(1, 10), side(2, 1000, shares=slow)), DEFAULT)
    assert check(verdict, "latency_p99").skipped
    assert judge(measure(side(1, 500), side(2, 1000, shares=slow)), DEFAULT).outcome == "fail"


def test_messages_show_whole_request_counts() -> None:
    verdict = judge(measure(side(1, 10_000.4, 50), side(2, 28.245)), DEFAULT)
    assert "28 of 30 canary requests" in verdict.message
    passing = judge(measure(side(1, 10_000.4, 50), side(2, 1000.6)), DEFAULT)
    assert passing.message == "all checks passed on 1001 canary requests"


# --- the analysis file -----------------------------------------------------------------


def test_no_file_means_the_defaults() -> None:
    config = load_analysis(None)
    assert config == AnalysisConfig()
    assert (config.window, config.min_requests, config.confidence) == (30.0, 30, 0.99)
    assert config.failure_limit == 2
    assert config.checks.error_rate.max == 0.05
    assert config.checks.latency_p99.max_ratio == 1.2


def test_the_documented_example_loads() -> None:
    config = load_analysis(EXAMPLE)
    assert config.window == 60.0
    assert [custom.name for custom in config.checks.custom] == ["queue_depth"]
    assert config.checks.latency_p99.max_ms == 250


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "analysis.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_an_unknown_key_names_file_line_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "window: 30s\nchecks:\n  error_rate:\n    max_increase: 1\n")
    with pytest.raises(
        ConfigError,
        match=rf"^{re.escape(str(path))}:4: checks\.error_rate\.max_increase: unknown key",
    ):
        load_analysis(path)


def test_a_wrong_value_names_file_line_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "window: 30s\nconfidence: 1.5\n")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(path))}:2: confidence: "):
        load_analysis(path)
    path = write(tmp_path, "window: soon\n")
    with pytest.raises(ConfigError, match=r":1: window: expected a duration like 30s"):
        load_analysis(path)


def test_a_template_with_an_unknown_variable_is_a_config_error(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "queries:\n"
        '  requests: sum(increase(slipway_gateway_requests_total{model="{model}"}[{window}]))\n'
        '  errors: sum(increase(x{job="{job}",model="{model}"}[{window}]))\n',
    )
    with pytest.raises(
        ConfigError, match=r":3: queries\.errors: unknown variable \{job\} in PromQL template"
    ):
        load_analysis(path)


def test_custom_check_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "checks:\n  custom:\n    - name: depth\n      query: max(q)\n")
    with pytest.raises(
        ConfigError, match=r":3: checks\.custom\.0: custom check 'depth' needs max, min or both"
    ):
        load_analysis(path)
    twice = "    - {name: depth, query: max(q), max: 1}\n"
    path = write(tmp_path, "checks:\n  custom:\n" + twice + twice)
    with pytest.raises(
        ConfigError, match=r"checks\.custom: custom check names must be unique, repeated: depth"
    ):
        load_analysis(path)


# --- templates and durations -----------------------------------------------------------


def test_render_fills_variables_and_leaves_label_matchers_alone() -> None:
    template = (
        'sum(increase(x{model="{model}",version="{version}",route="{route}",code!="OK"}[{window}]))'
    )
    assert template_variables(template) == ["model", "version", "route", "window"]
    rendered = render(template, model='a"b', version=7, route="canary", window_seconds=90)
    assert rendered == 'sum(increase(x{model="a\\"b",version="7",route="canary",code!="OK"}[90s]))'


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30.0), ("1m30s", 90.0), ("500ms", 0.5), ("2h", 7200.0), (45, 45.0)],
)
def test_parse_duration(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "30 s", "-5s", "1x", "0s", True])
def test_parse_duration_rejects(text: str | bool) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_format_duration_is_what_promql_accepts() -> None:
    assert [format_duration(s) for s in (30, 90.0, 0.25, 1.5)] == ["30s", "90s", "250ms", "1500ms"]


def test_default_queries_name_series_the_gateway_exports() -> None:
    metrics = GatewayMetrics()
    metrics.observe_request("m", 1, "canary", "OK", "rest", 0.01)
    metrics.observe_shadow("m", 2, "OK", agreement=1.0, abs_diff=0.0)
    metrics.observe_failover("m", 2, 1)
    metrics.observe_feedback("m", 1, "canary", correct=True)
    body, _ = metrics.render()
    exported = {
        sample.name
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }
    queries = AnalysisConfig().queries
    named = {
        name
        for field in type(queries).model_fields
        for name in re.findall(r"slipway_[a-z_]+", getattr(queries, field))
    }
    assert "slipway_gateway_feedback_total" in named
    assert named <= exported
