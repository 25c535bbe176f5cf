"""Canary analysis: what "healthy" means for a rollout, and the verdict on one measurement.

The analysis file (YAML, every key optional) sets the window, the evidence needed before
any verdict, the bounds per check and the PromQL templates a Prometheus provider runs.
``judge`` is a pure function of a ``Measurement`` and that config, so a verdict can be
recomputed from the numbers an event log recorded.

A canary fails a check only when it is worse than the bound *and* an exact one-sided test
says so with the configured confidence, corrected for every bound tested in the same
analysis: traffic is noisy, and rolling back a good version on one unlucky minute costs
as much trust as promoting a bad one. The bounds relative to stable are non-inferiority
margins (worse than stable by more than the margin), never equality with stable. When the
point estimate is past a bound and the evidence leans that way without being conclusive,
the verdict is "inconclusive" and the controller keeps watching.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, field_validator, model_validator

from contracts.yaml_config import StrictModel, load_yaml_model
from ops import stats
from ops.measurement import Measurement, SideMeasurement

LATENCY_QUANTILE = 0.99
# A point estimate past a bound holds the rollout ("inconclusive") only while the evidence
# leans towards a violation: a corrected p-value under even odds. Above it, the excess is
# what chance alone produces at these counts (3 errors in 150 requests against a 1 % base
# is 2 %, past stable + 0.5 points), and holding on it would stall every good rollout at
# its first steps, since a hold restarts the bake.
SUGGESTIVE_P = 0.5

# Durations as Prometheus writes them: "500ms", "30s", "1m30s", "2h".
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: str | float | int) -> float:
    """Seconds from "30s", "1m30s", "500ms" (or a bare number of seconds)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 30s, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = value.strip()
        parts = _DURATION_PART.findall(text)
        if not text or "".join(number + unit for number, unit in parts) != text:
            raise ValueError(f"expected a duration like 30s, 1m30s or 500ms, got {value!r}")
        seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"a duration must be positive, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """A PromQL range duration: whole seconds as "30s", anything finer in milliseconds."""
    milliseconds = round(seconds * 1000)
    if milliseconds <= 0:
        raise ValueError(f"a duration must be at least 1ms, got {seconds}s")
    return f"{milliseconds // 1000}s" if milliseconds % 1000 == 0 else f"{milliseconds}ms"


Duration = Annotated[float, BeforeValidator(parse_duration)]

# ---------------------------------------------------------------------------------------
# PromQL templates

TEMPLATE_VARIABLES = ("model", "version", "route", "window")
# A bare `{identifier}` is never valid PromQL (a label matcher needs an operator), so it
# can only be a template variable: no escaping needed for the braces of label matchers.
_VARIABLE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def template_variables(template: str) -> list[str]:
    """The variable names a template uses, in order of appearance."""
    return _VARIABLE.findall(template)


def render(template: str, *, model: str, version: int, route: str, window_seconds: float) -> str:
    """The PromQL a template stands for; values are escaped for a double-quoted label value."""
    values = {
        "model": _promql_string(model),
        "version": str(version),
        "route": _promql_string(route),
        "window": format_duration(window_seconds),
    }
    return _VARIABLE.sub(lambda match: values[match.group(1)], template)


def _promql_string(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _check_template(template: str) -> str:
    unknown = sorted(set(template_variables(template)) - set(TEMPLATE_VARIABLES))
    if unknown:
        names = ", ".join("{" + name + "}" for name in unknown)
        known = ", ".join("{" + name + "}" for name in TEMPLATE_VARIABLES)
        raise ValueError(f"unknown variable {names} in PromQL template (known: {known})")
    if not template.strip():
        raise ValueError("PromQL template is empty")
    return template


Template = Annotated[str, AfterValidator(_check_template)]

_SELECTOR = 'model="{model}",version="{version}",route="{route}"'
_VERSION_SELECTOR = 'model="{model}",version="{version}"'


class Queries(StrictModel):
    """PromQL templates of the Prometheus provider, one scalar (or ``le`` vector) each.

    The defaults read the gateway's own series (serving/metrics.py). Each side is selected
    by ``route`` (``stable`` or ``canary``) as well as version, so explicit-version
    requests from other clients never count for or against a canary. Shadow templates
    are rendered with the canary version and route ``shadow``. ``labelled`` and ``correct``
    count the predictions whose true label came back through the feedback API (all of
    them, and those whose top-1 class matched it). Every count is an
    ``increase()`` over ``{window}`` because the statistical tests need counts, not rates.
    """

    requests: Template = f"sum(increase(slipway_gateway_requests_total{{{_SELECTOR}}}[{{window}}]))"
    errors: Template = (
        f'sum(increase(slipway_gateway_requests_total{{{_SELECTOR},code!="OK"}}[{{window}}]))'
    )
    latency_buckets: Template = (
        f"sum by (le) (increase(slipway_gateway_request_seconds_bucket{{{_SELECTOR}}}[{{window}}]))"
    )
    failovers: Template = (
        "sum(increase(slipway_gateway_failovers_total"
        '{model="{model}",from_version="{version}"}[{window}]))'
    )
    shadow_agreement: Template = (
        f"sum(increase(slipway_gateway_shadow_agreement_sum{{{_VERSION_SELECTOR}}}[{{window}}]))"
        f" / sum(increase(slipway_gateway_shadow_agreement_count{{{_VERSION_SELECTOR}}}[{{window}}]))"
    )
    shadow_requests: Template = (
        f"sum(increase(slipway_gateway_shadow_agreement_count{{{_VERSION_SELECTOR}}}[{{window}}]))"
    )
    labelled: Template = f"sum(increase(slipway_gateway_feedback_total{{{_SELECTOR}}}[{{window}}]))"
    correct: Template = f'sum(increase(slipway_gateway_feedback_total{{{_SELECTOR},outcome="correct"}}[{{window}}]))'


# ---------------------------------------------------------------------------------------
# Checks


Proportion = Annotated[float, Field(ge=0, le=1)]


class ErrorRateCheck(StrictModel):
    """Errors per request (any code but OK).

    Fails when the evidence says the canary's rate is more than ``max_increase_points``
    percentage points above stable's (a non-inferiority margin: a canary merely as bad as
    stable never fails), or above ``max`` (a fraction) in absolute terms; either may be
    null."""

    max_increase_points: float | None = Field(default=0.5, ge=0, lt=100)
    max: Proportion | None = 0.05


class LatencyCheck(StrictModel):
    """p99 latency: at most ``max_ratio`` × stable's p99 + ``max_added_ms``, and at most
    ``max_ms`` in absolute terms. The added milliseconds keep a 1.2 ratio from failing a
    canary that went from 1 ms to 1.3 ms, a difference no user notices."""

    max_ratio: float | None = Field(default=1.2, gt=0)
    max_added_ms: float | None = Field(default=5.0, ge=0)
    max_ms: float | None = Field(default=None, gt=0)


class ShadowAgreementCheck(StrictModel):
    """Mean fraction of rows whose top-1 class matches the primary answer, on mirrored requests."""

    min: Proportion = 0.95


class FailoverRateCheck(StrictModel):
    """Canary requests retried on stable, per canary request: at most
    ``max_increase_points`` percentage points above stable's error rate (a failover is a
    failure stable would have answered), and at most ``max`` in absolute terms. A fixed
    absolute limit sits on whatever error rate the model normally has, so it is off by
    default."""

    max_increase_points: float | None = Field(default=0.5, ge=0, lt=100)
    max: Proportion | None = None


class AccuracyCheck(StrictModel):
    """Live top-1 accuracy on the predictions whose true label came back (feedback API):
    the canary fails when the evidence says it is more than ``max_decrease_points``
    percentage points below stable. Skipped, never holding a rollout back, while either
    side has fewer than ``min_labels`` labels in the window: models without feedback roll
    out on the other checks."""

    max_decrease_points: float = Field(default=2.0, ge=0, lt=100)
    min_labels: int = Field(default=100, ge=1)


class CustomCheck(StrictModel):
    """A PromQL template rendered for the canary (version and route ``canary``) whose single
    value must stay within ``min``/``max``."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    query: Template
    max: float | None = None
    min: float | None = None

    @model_validator(mode="after")
    def _bounded(self) -> CustomCheck:
        if self.max is None and self.min is None:
            raise ValueError(f"custom check {self.name!r} needs max, min or both")
        if self.max is not None and self.min is not None and self.min > self.max:
            raise ValueError(f"custom check {self.name!r}: min {self.min} > max {self.max}")
        return self


class Checks(StrictModel):
    """The checks to run; set one to null to turn it off."""

    error_rate: ErrorRateCheck | None = ErrorRateCheck()
    latency_p99: LatencyCheck | None = LatencyCheck()
    shadow_agreement: ShadowAgreementCheck | None = ShadowAgreementCheck()
    failover_rate: FailoverRateCheck | None = FailoverRateCheck()
    accuracy: AccuracyCheck | None = AccuracyCheck()
    custom: list[CustomCheck] = Field(default_factory=list)

    @field_validator("custom")
    @classmethod
    def _unique_names(cls, custom: list[CustomCheck]) -> list[CustomCheck]:
        names = [check.name for check in custom]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(
                f"custom check names must be unique, repeated: {', '.join(duplicates)}"
            )
        return custom


class AnalysisConfig(StrictModel):
    """The whole analysis file; ``AnalysisConfig()`` is the default analysis.

    ``confidence`` applies to each analysis as a whole (Holm's correction over every bound
    its checks test), and ``failure_limit`` failing analyses in a row roll back (Argo's
    ``failureLimit``, Flagger's ``threshold``): windows overlap, so one unlucky stretch of
    traffic fails several analyses in a row. The defaults were chosen on the simulated
    rollouts of ``benchmarks/rollout.py``: at confidence 0.99 and failure limit 2, no good
    canary of 1000 rolled back (0.3 % at 0.95 and 2, 0.5 % of 200 at 0.95 and 1), every bad
    one of the power scenarios did, and a canary failing 20 % of 10 requests a second was
    out within 8 s of 1 s scrapes (10 s with 50 ``min_requests``, 12 s with a limit of 3).
    """

    window: Duration = 30.0
    min_requests: int = Field(default=30, ge=1)
    confidence: float = Field(default=0.99, gt=0.5, lt=1)
    failure_limit: int = Field(default=2, ge=1)
    checks: Checks = Checks()
    queries: Queries = Queries()


def load_analysis(path: str | Path | None) -> AnalysisConfig:
    """The analysis file at ``path`` (errors as ``file:line: key: problem``), or the defaults."""
    return AnalysisConfig() if path is None else load_yaml_model(path, AnalysisConfig)


# ---------------------------------------------------------------------------------------
# Verdicts

Outcome = Literal["pass", "fail", "inconclusive", "no_data"]


@dataclass(frozen=True)
class CheckResult:
    """One check of one verdict.

    ``passed`` is True or False when the check decided, None when it could not (not enough
    evidence yet, or no stable baseline). ``skipped`` marks a check that does not apply to
    this measurement (no shadow traffic, a custom value the provider cannot compute) and
    therefore does not hold the verdict back. Latencies are in milliseconds, rates are
    fractions.
    """

    name: str
    stable: float | None
    canary: float | None
    limit: float | None
    passed: bool | None
    p_value: float | None
    message: str
    skipped: bool = False


@dataclass(frozen=True)
class Verdict:
    """The outcome, the checks behind it, and one line saying why (for events and alerts)."""

    outcome: Outcome
    checks: list[CheckResult]
    message: str


def no_data(reason: str) -> Verdict:
    """The verdict when there is nothing to judge (provider down, no canary traffic)."""
    return Verdict("no_data", [], reason)


def judge(measurement: Measurement, config: AnalysisConfig) -> Verdict:
    """The verdict on one measurement.

    - no canary traffic and no shadow comparisons: "no_data";
    - fewer than ``min_requests`` canary requests (shadow comparisons while the canary gets
      no traffic of its own): "inconclusive", whatever the numbers say;
    - any check failed: "fail"; any check undecided: "inconclusive"; else "pass".

    A bound fails only when its Holm-adjusted p-value, over every bound tested in this
    analysis, is below 1 - ``confidence``: five checks at 1 % each would otherwise roll
    back a good canary on about one analysis in twenty.
    """
    canary = measurement.canary
    has_shadow = measurement.shadow_agreement is not None and measurement.shadow_requests > 0
    if canary.requests <= 0 and not has_shadow:
        return no_data(f"no requests reached canary version {canary.version} in the window")
    alpha = 1 - config.confidence
    tested: list[_Tested | CheckResult] = []
    if canary.requests > 0:
        tested += _traffic_checks(measurement, config)
    checks = _decide_all(tested, alpha)
    if config.checks.shadow_agreement is not None and has_shadow:
        checks.append(
            _shadow_agreement(measurement, config.checks.shadow_agreement, config.min_requests)
        )
    checks += [_custom(check, measurement.custom.get(check.name)) for check in config.checks.custom]

    if canary.requests > 0:
        evidence, kind = canary.requests, "canary requests"
    else:
        evidence, kind = measurement.shadow_requests, "shadow comparisons"
    if evidence < config.min_requests:
        waiting = f"{evidence:.0f} of {config.min_requests} {kind} needed before a verdict"
        undecided = [
            replace(check, passed=None) if not check.skipped else check for check in checks
        ]
        return Verdict("inconclusive", undecided, waiting)
    failed = [check for check in checks if check.passed is False]
    if failed:
        return Verdict("fail", checks, "; ".join(check.message for check in failed))
    undecided = [check for check in checks if check.passed is None and not check.skipped]
    if undecided:
        return Verdict("inconclusive", checks, "; ".join(check.message for check in undecided))
    return Verdict("pass", checks, f"all checks passed on {evidence:.0f} {kind}")


def _traffic_checks(
    measurement: Measurement, config: AnalysisConfig
) -> list[_Tested | CheckResult]:
    stable, canary, checks = measurement.stable, measurement.canary, config.checks
    results: list[_Tested | CheckResult] = []
    if checks.error_rate is not None:
        errors = checks.error_rate
        results.append(
            _rate_check(
                "error_rate", stable, canary, canary.errors, errors.max_increase_points, errors.max
            )  # fmt: skip
        )
    if checks.latency_p99 is not None:
        results.append(_latency(stable, canary, checks.latency_p99, config.min_requests))
    if checks.failover_rate is not None:
        failovers = checks.failover_rate
        results.append(
            _rate_check(
                "failover_rate",
                stable,
                canary,
                canary.failovers,
                failovers.max_increase_points,
                failovers.max,
            )  # fmt: skip
        )
    if checks.accuracy is not None:
        results.append(_accuracy(stable, canary, checks.accuracy))
    return results


@dataclass(frozen=True)
class _Bound:
    """One bound of a check: whether the point estimate is past it, and the p-value of
    "the canary is within it" (Holm-adjusted once every bound of the analysis is known)."""

    description: str
    exceeded: bool
    p_value: float


@dataclass(frozen=True)
class _Tested:
    """A check whose bounds are tested, waiting for the analysis-wide correction.

    ``worse`` is how the canary is past a bound ("above" a rate, "below" an accuracy);
    ``baseline_missing`` marks a check that compares with stable when stable has no
    usable numbers."""

    name: str
    stable: float | None
    canary: float | None
    limit: float | None
    bounds: list[_Bound]
    unit: str
    baseline_missing: bool
    worse: str = "above"


def _decide_all(tested: list[_Tested | CheckResult], alpha: float) -> list[CheckResult]:
    """Holm's correction over every bound tested, then each check's result."""
    bounds = [bound for item in tested if isinstance(item, _Tested) for bound in item.bounds]
    adjusted = iter(stats.holm([bound.p_value for bound in bounds]))
    results = []
    for item in tested:
        if isinstance(item, CheckResult):
            results.append(item)
            continue
        corrected = [replace(bound, p_value=next(adjusted)) for bound in item.bounds]
        results.append(_decide(replace(item, bounds=corrected), alpha, len(bounds)))
    return results


def _decide(check: _Tested, alpha: float, tests: int) -> CheckResult:
    """Fail on a bound exceeded with significance, hold on one exceeded on evidence that
    leans towards a violation (``SUGGESTIVE_P``), pass otherwise."""
    name, stable, canary, limit, unit = (
        check.name, check.stable, check.canary, check.limit, check.unit
    )  # fmt: skip
    shown = f"{_show(canary, unit)} (stable {_show(stable, unit)})"
    corrected = f"Holm-adjusted over {tests} tests" if tests > 1 else "one test"
    for bound in check.bounds:
        if bound.exceeded and bound.p_value < alpha:
            message = (
                f"{name} {shown} {check.worse} {bound.description}, "
                f"p={bound.p_value:.3g} ({corrected})"
            )
            return CheckResult(name, stable, canary, limit, False, bound.p_value, message)
    for bound in check.bounds:
        if bound.exceeded and bound.p_value < SUGGESTIVE_P:
            message = (
                f"{name} {shown} {check.worse} {bound.description} but not significant yet "
                f"(p={bound.p_value:.3g} ≥ {alpha:.3g}, {corrected})"
            )
            return CheckResult(name, stable, canary, limit, None, bound.p_value, message)
    if check.baseline_missing and not check.bounds:
        # No stable traffic and no baseline: nothing to compare, nothing to hold for.
        message = f"{name} {shown}: no stable traffic to compare with"
        return CheckResult(name, stable, canary, limit, None, None, message, skipped=True)
    p_value = min((bound.p_value for bound in check.bounds), default=None)
    if any(bound.exceeded for bound in check.bounds):
        message = (
            f"{name} {shown} past {_show(limit, unit)} by chance alone "
            f"(p={p_value:.3g}, {corrected})"
        )
    else:
        message = f"{name} {shown} within {_show(limit, unit)}"
    return CheckResult(name, stable, canary, limit, True, p_value, message)


def _rate_bounds(
    stable_events: float,
    stable_total: float,
    canary_events: float,
    canary_total: float,
    increase_points: float | None,
    maximum: float | None,
) -> tuple[list[_Bound], float | None]:
    """The bounds of a rate check (relative to stable when it has traffic, absolute) and
    the tightest limit. Counts are clipped to their totals: extrapolated increases of two
    series can disagree by a fraction."""
    canary_events = min(canary_events, canary_total)
    canary_rate = canary_events / canary_total
    bounds, limits = [], []
    if increase_points is not None and stable_total > 0:
        stable_events = min(stable_events, stable_total)
        margin = increase_points / 100
        relative = stable_events / stable_total + margin
        test = stats.rate_increase_test(
            stable_events, stable_total, canary_events, canary_total, margin
        )
        bounds.append(
            _Bound(f"stable + {increase_points:g} points", canary_rate > relative, test.p_value)
        )
        limits.append(relative)
    if maximum is not None:
        test = stats.binomial_above_test(canary_events, canary_total, maximum)
        bounds.append(_Bound(f"max {maximum:.2%}", canary_rate > maximum, test.p_value))
        limits.append(maximum)
    return bounds, min(limits, default=None)


def _rate_check(
    name: str,
    stable: SideMeasurement,
    canary: SideMeasurement,
    canary_events: float,
    increase_points: float | None,
    maximum: float | None,
) -> _Tested:
    """Canary events per request (errors, or failovers: failures stable would have answered)
    against stable's error rate + ``increase_points`` and against ``maximum``."""
    bounds, limit = _rate_bounds(
        stable.errors, stable.requests, canary_events, canary.requests, increase_points, maximum
    )
    rate = min(canary_events, canary.requests) / canary.requests
    missing = stable.error_rate is None and increase_points is not None
    return _Tested(name, stable.error_rate, rate, limit, bounds, "%", missing)


def _accuracy(
    stable: SideMeasurement, canary: SideMeasurement, check: AccuracyCheck
) -> _Tested | CheckResult:
    """Non-inferiority on accuracy, tested as misclassification rates: the canary's may be
    at most ``max_decrease_points`` above stable's."""
    name = "accuracy"
    stable_accuracy, canary_accuracy = stable.accuracy, canary.accuracy
    labels = min(stable.labelled, canary.labelled)
    if labels < check.min_labels:
        message = (
            f"{name}: {canary.labelled:.0f} canary and {stable.labelled:.0f} stable labels, "
            f"{check.min_labels} each needed; not judged"
        )
        return CheckResult(
            name, stable_accuracy, canary_accuracy, None, None, None, message, skipped=True
        )
    bounds, limit = _rate_bounds(
        stable.labelled - min(stable.correct, stable.labelled), stable.labelled,
        canary.labelled - min(canary.correct, canary.labelled), canary.labelled,
        check.max_decrease_points, None,
    )  # fmt: skip
    shown = [
        replace(bound, description=f"stable - {check.max_decrease_points:g} points")
        for bound in bounds
    ]
    floor = None if limit is None else 1 - limit
    return _Tested(name, stable_accuracy, canary_accuracy, floor, shown, "%", False, "below")


def _latency(
    stable: SideMeasurement, canary: SideMeasurement, check: LatencyCheck, min_requests: int
) -> _Tested | CheckResult:
    name = "latency_p99"
    stable_p99 = _milliseconds(stats.histogram_quantile(LATENCY_QUANTILE, stable.latency_buckets))
    canary_p99 = _milliseconds(stats.histogram_quantile(LATENCY_QUANTILE, canary.latency_buckets))
    if canary_p99 is None:
        message = f"{name}: no latency observations for canary version {canary.version}"
        return CheckResult(name, stable_p99, None, None, None, None, message)
    relative_on = check.max_ratio is not None or check.max_added_ms is not None
    # A p99 of a few stable requests is one request's latency: not a baseline.
    observations = sum(stats.bucket_counts(stable.latency_buckets))
    baseline = stable_p99 if observations >= min_requests else None
    bounds, limits = [], []
    if relative_on and baseline is not None:
        ratio = 1.0 if check.max_ratio is None else check.max_ratio
        relative = baseline * ratio + (check.max_added_ms or 0.0)
        canary_buckets, stable_buckets = stats.align_buckets(
            canary.latency_buckets, stable.latency_buckets
        )
        slower = stats.mann_whitney_buckets(
            stats.bucket_counts(canary_buckets), stats.bucket_counts(stable_buckets)
        )
        # The rank test alone is overconfident when nearly every observation ties in one
        # bucket (a fast model): a single slow canary request would "prove" a slowdown.
        # Requiring the tail itself to be significant too (an intersection-union test:
        # the larger p-value) keeps one slow request a blip.
        p_value = max(slower.p_value, _tail_p_value(canary.latency_buckets, relative))
        description = f"{ratio:g} × stable + {check.max_added_ms or 0:g} ms"
        bounds.append(_Bound(description, canary_p99 > relative, p_value))
        limits.append(relative)
    if check.max_ms is not None:
        p_value = _tail_p_value(canary.latency_buckets, check.max_ms)
        bounds.append(_Bound(f"max {check.max_ms:g} ms", canary_p99 > check.max_ms, p_value))
        limits.append(check.max_ms)
    limit = min(limits, default=None)
    missing = relative_on and baseline is None
    return _Tested(name, stable_p99, canary_p99, limit, bounds, "ms", missing)


def _tail_p_value(buckets: stats.Buckets, limit_ms: float) -> float:
    """p-value of "the p99 is above ``limit_ms``", i.e. of more than 1 % of requests being
    slower than it (the exact binomial test on the interpolated tail)."""
    above, total = stats.fraction_above(limit_ms / 1000, buckets)
    return stats.binomial_above_test(min(above, total), total, 1 - LATENCY_QUANTILE).p_value


def _shadow_agreement(
    measurement: Measurement, check: ShadowAgreementCheck, min_requests: int
) -> CheckResult:
    """Agreement is a mean of per-request fractions, with no count test behind it: the
    ``min_requests`` comparisons it needs are its only guard against noise."""
    name = "shadow_agreement"
    agreement, compared = measurement.shadow_agreement, measurement.shadow_requests
    if compared < min_requests:
        message = f"{name}: {compared:.0f} of {min_requests} shadow comparisons, not judged"
        skipped = measurement.canary.requests > 0
        return CheckResult(name, None, agreement, check.min, None, None, message, skipped=skipped)
    passed = agreement is not None and agreement >= check.min
    relation = "at least" if passed else "below"
    message = f"{name} {_show(agreement, '%')} {relation} min {check.min:.2%} on {compared:.0f} comparisons"
    return CheckResult(name, None, agreement, check.min, passed, None, message)


def _custom(check: CustomCheck, value: float | None) -> CheckResult:
    if value is None or math.isnan(value):
        message = f"{check.name}: no value (query returned nothing or the provider cannot run it)"
        return CheckResult(check.name, None, None, check.max, None, None, message, skipped=True)
    if check.max is not None and value > check.max:
        return CheckResult(
            check.name,
            None,
            value,
            check.max,
            False,
            None,
            f"{check.name} {value:g} above max {check.max:g}",
        )
    if check.min is not None and value < check.min:
        return CheckResult(
            check.name,
            None,
            value,
            check.min,
            False,
            None,
            f"{check.name} {value:g} below min {check.min:g}",
        )
    limit = check.max if check.max is not None else check.min
    return CheckResult(
        check.name, None, value, limit, True, None, f"{check.name} {value:g} within bounds"
    )


def _milliseconds(seconds: float) -> float | None:
    return None if math.isnan(seconds) else seconds * 1000


def _show(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2%}" if unit == "%" else f"{value:.3g} {unit}"
