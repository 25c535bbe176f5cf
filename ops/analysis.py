"""Canary analysis: what "healthy" means for a rollout, and the verdict on one measurement.

The analysis file (YAML, every key optional) sets the window, the evidence needed before
any verdict, the bounds per check and the PromQL templates a Prometheus provider runs.
``judge`` is a pure function of a ``Measurement`` and that config, so a verdict can be
recomputed from the numbers an event log recorded.

A canary fails a check only when it is worse than the bound *and* a one-sided test says it
is worse with the configured confidence: traffic is noisy, and rolling back a good
version on one unlucky minute costs as much trust as promoting a bad one. When the point
estimate is past the bound but the evidence is not there yet, the verdict is
"inconclusive" and the controller keeps watching.
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
    are rendered with the canary version and route ``shadow``. Every count is an
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


# ---------------------------------------------------------------------------------------
# Checks


Proportion = Annotated[float, Field(ge=0, le=1)]


class ErrorRateCheck(StrictModel):
    """Errors per request (any code but OK): ``max_increase_points`` percentage points above
    stable at most, and ``max`` (a fraction) in absolute terms; either may be null."""

    max_increase_points: float | None = Field(default=0.5, ge=0, le=100)
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
    """Requests retried on stable after the canary failed, per canary request."""

    max: Proportion = 0.01


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
    """The whole analysis file; ``AnalysisConfig()`` is the default analysis."""

    window: Duration = 30.0
    min_requests: int = Field(default=50, ge=1)
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
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
    """
    canary = measurement.canary
    has_shadow = measurement.shadow_agreement is not None and measurement.shadow_requests > 0
    if canary.requests <= 0 and not has_shadow:
        return no_data(f"no requests reached canary version {canary.version} in the window")
    alpha = 1 - config.confidence
    checks: list[CheckResult] = []
    if canary.requests > 0:
        checks += _traffic_checks(measurement, config.checks, alpha)
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
        waiting = f"{evidence:g} of {config.min_requests} {kind} needed before a verdict"
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
    return Verdict("pass", checks, f"all checks passed on {evidence:g} {kind}")


def _traffic_checks(measurement: Measurement, checks: Checks, alpha: float) -> list[CheckResult]:
    results = []
    if checks.error_rate is not None:
        results.append(
            _error_rate(measurement.stable, measurement.canary, checks.error_rate, alpha)
        )
    if checks.latency_p99 is not None:
        results.append(_latency(measurement.stable, measurement.canary, checks.latency_p99, alpha))
    if checks.failover_rate is not None:
        results.append(_failover_rate(measurement.canary, checks.failover_rate, alpha))
    return results


@dataclass(frozen=True)
class _Bound:
    """One bound of a check: whether the point estimate exceeds it, and the test's p-value."""

    description: str
    exceeded: bool
    p_value: float


def _decide(
    name: str,
    stable: float | None,
    canary: float | None,
    limit: float | None,
    bounds: list[_Bound],
    alpha: float,
    unit: str,
    baseline_missing: bool,
) -> CheckResult:
    """Fail on a bound exceeded with significance, hold on one exceeded without it."""
    shown = f"{_show(canary, unit)} (stable {_show(stable, unit)})"
    for bound in bounds:
        if bound.exceeded and bound.p_value < alpha:
            message = f"{name} {shown} above {bound.description}, p={bound.p_value:.3g}"
            return CheckResult(name, stable, canary, limit, False, bound.p_value, message)
    for bound in bounds:
        if bound.exceeded:
            message = (
                f"{name} {shown} above {bound.description} but not significant yet "
                f"(p={bound.p_value:.3g} ≥ {alpha:.3g})"
            )
            return CheckResult(name, stable, canary, limit, None, bound.p_value, message)
    if baseline_missing and not bounds:
        # At 100 % canary weight stable gets no traffic: nothing to compare, nothing to hold for.
        message = f"{name} {shown}: no stable traffic to compare with"
        return CheckResult(name, stable, canary, limit, None, None, message, skipped=True)
    p_value = min((bound.p_value for bound in bounds), default=None)
    message = f"{name} {shown} within {_show(limit, unit)}"
    return CheckResult(name, stable, canary, limit, True, p_value, message)


def _error_rate(
    stable: SideMeasurement, canary: SideMeasurement, check: ErrorRateCheck, alpha: float
) -> CheckResult:
    canary_errors = min(canary.errors, canary.requests)
    canary_rate = canary_errors / canary.requests
    stable_rate = stable.error_rate
    bounds, limits = [], []
    if check.max_increase_points is not None and stable_rate is not None:
        relative = stable_rate + check.max_increase_points / 100
        test = stats.two_proportion_z_test(
            min(stable.errors, stable.requests), stable.requests, canary_errors, canary.requests
        )
        bounds.append(
            _Bound(
                f"stable + {check.max_increase_points:g} points",
                canary_rate > relative,
                test.p_value,
            )
        )
        limits.append(relative)
    if check.max is not None:
        test = stats.proportion_above_test(canary_errors, canary.requests, check.max)
        bounds.append(_Bound(f"max {check.max:.2%}", canary_rate > check.max, test.p_value))
        limits.append(check.max)
    limit = min(limits, default=None)
    missing = stable_rate is None and check.max_increase_points is not None
    return _decide("error_rate", stable_rate, canary_rate, limit, bounds, alpha, "%", missing)


def _latency(
    stable: SideMeasurement, canary: SideMeasurement, check: LatencyCheck, alpha: float
) -> CheckResult:
    name = "latency_p99"
    stable_p99 = _milliseconds(stats.histogram_quantile(LATENCY_QUANTILE, stable.latency_buckets))
    canary_p99 = _milliseconds(stats.histogram_quantile(LATENCY_QUANTILE, canary.latency_buckets))
    if canary_p99 is None:
        message = f"{name}: no latency observations for canary version {canary.version}"
        return CheckResult(name, stable_p99, None, None, None, None, message)
    relative_on = check.max_ratio is not None or check.max_added_ms is not None
    bounds, limits = [], []
    if relative_on and stable_p99 is not None:
        ratio = 1.0 if check.max_ratio is None else check.max_ratio
        relative = stable_p99 * ratio + (check.max_added_ms or 0.0)
        canary_buckets, stable_buckets = stats.align_buckets(
            canary.latency_buckets, stable.latency_buckets
        )
        slower = stats.mann_whitney_buckets(
            stats.bucket_counts(canary_buckets), stats.bucket_counts(stable_buckets)
        )
        # The rank test alone is overconfident when nearly every observation ties in one
        # bucket (a fast model): a single slow canary request would "prove" a slowdown.
        # Requiring the tail itself to be significant too keeps one slow request a blip.
        p_value = max(slower.p_value, _tail_p_value(canary.latency_buckets, relative))
        description = f"{ratio:g} × stable + {check.max_added_ms or 0:g} ms"
        bounds.append(_Bound(description, canary_p99 > relative, p_value))
        limits.append(relative)
    if check.max_ms is not None:
        p_value = _tail_p_value(canary.latency_buckets, check.max_ms)
        bounds.append(_Bound(f"max {check.max_ms:g} ms", canary_p99 > check.max_ms, p_value))
        limits.append(check.max_ms)
    limit = min(limits, default=None)
    missing = relative_on and stable_p99 is None
    return _decide(name, stable_p99, canary_p99, limit, bounds, alpha, "ms", missing)


def _tail_p_value(buckets: stats.Buckets, limit_ms: float) -> float:
    """p-value of "the p99 is above ``limit_ms``", i.e. of more than 1 % of requests being
    slower than it (a one-sample proportion test on the interpolated tail)."""
    above, total = stats.fraction_above(limit_ms / 1000, buckets)
    return stats.proportion_above_test(min(above, total), total, 1 - LATENCY_QUANTILE).p_value


def _failover_rate(canary: SideMeasurement, check: FailoverRateCheck, alpha: float) -> CheckResult:
    failovers = min(canary.failovers, canary.requests)
    rate = failovers / canary.requests
    test = stats.proportion_above_test(failovers, canary.requests, check.max)
    bound = _Bound(f"max {check.max:.2%}", rate > check.max, test.p_value)
    return _decide("failover_rate", None, rate, check.max, [bound], alpha, "%", False)


def _shadow_agreement(
    measurement: Measurement, check: ShadowAgreementCheck, min_requests: int
) -> CheckResult:
    """Agreement is a mean of per-request fractions, with no count test behind it: the
    ``min_requests`` comparisons it needs are its only guard against noise."""
    name = "shadow_agreement"
    agreement, compared = measurement.shadow_agreement, measurement.shadow_requests
    if compared < min_requests:
        message = f"{name}: {compared:g} of {min_requests} shadow comparisons, not judged"
        skipped = measurement.canary.requests > 0
        return CheckResult(name, None, agreement, check.min, None, None, message, skipped=skipped)
    passed = agreement is not None and agreement >= check.min
    relation = "at least" if passed else "below"
    message = (
        f"{name} {_show(agreement, '%')} {relation} min {check.min:.2%} on {compared:g} comparisons"
    )
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
