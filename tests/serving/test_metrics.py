"""Gateway metrics: names, labels, values and a parseable exposition."""

from __future__ import annotations

import itertools

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.metrics import LATENCY_BUCKETS, STATUS_CODES, GatewayMetrics


def families(metrics: GatewayMetrics) -> dict:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain; version=0.0.4")
    return {family.name: family for family in text_string_to_metric_families(body.decode())}


def sample(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_every_contract_metric_is_exposed_with_its_type() -> None:
    metrics = GatewayMetrics()
    metrics.observe_request("digits", 1, "stable", "OK", "grpc", 0.01)
    metrics.observe_batch("digits", 1, "stable", 3, 4, [0.001, 0.002, 0.003], 0.02)
    metrics.set_queue_depth("digits", 1, 2)
    with metrics.track_in_flight("digits", 1):
        pass
    metrics.set_model_loaded("digits", 1, True)
    metrics.observe_model_load("digits", 1, 3.5)
    metrics.observe_shadow("digits", 2, "OK", agreement=1.0, abs_diff=0.01)
    metrics.observe_failover("digits", 2, 1)
    expected = {
        "slipway_gateway_requests": "counter",
        "slipway_gateway_request_seconds": "histogram",
        "slipway_gateway_queue_seconds": "histogram",
        "slipway_gateway_execution_seconds": "histogram",
        "slipway_gateway_batch_size": "histogram",
        "slipway_gateway_batch_padding_ratio": "histogram",
        "slipway_gateway_queue_depth": "gauge",
        "slipway_gateway_in_flight": "gauge",
        "slipway_gateway_model_loaded": "gauge",
        "slipway_gateway_model_load_seconds": "gauge",
        "slipway_gateway_shadow_requests": "counter",
        "slipway_gateway_shadow_agreement": "histogram",
        "slipway_gateway_shadow_abs_diff": "histogram",
        "slipway_gateway_failovers": "counter",
        "slipway_gateway_feedback": "counter",
        "slipway_gateway_feedback_absolute_error": "histogram",
        "slipway_gateway_prediction_log_records": "counter",
        "slipway_gateway_client_disconnects": "counter",
    }
    found = families(metrics)
    # prometheus_client adds a ``_created`` timestamp gauge next to counters and histograms.
    types = {name: f.type for name, f in found.items() if not name.endswith("_created")}
    assert types == expected
    sample_names = {s.name for family in found.values() for s in family.samples}
    assert "slipway_gateway_requests_total" in sample_names
    assert "slipway_gateway_failovers_total" in sample_names
    assert "slipway_gateway_shadow_requests_total" in sample_names


def test_request_metrics_carry_model_version_route_code_and_api() -> None:
    metrics = GatewayMetrics()
    metrics.observe_request("digits", 2, "canary", "OK", "rest", 0.004)
    metrics.observe_request("digits", 2, "canary", "OK", "rest", 0.2)
    metrics.observe_request("digits", 1, "stable", "DEADLINE_EXCEEDED", "grpc", 1.0)
    labels = {"model": "digits", "version": "2", "route": "canary"}
    assert sample(metrics, "slipway_gateway_requests_total", **labels, code="OK", api="rest") == 2
    assert sample(metrics, "slipway_gateway_request_seconds_count", **labels) == 2
    assert sample(metrics, "slipway_gateway_request_seconds_sum", **labels) == pytest.approx(0.204)
    assert sample(metrics, "slipway_gateway_request_seconds_bucket", **labels, le="0.0056") == 1
    stable = {"model": "digits", "version": "1", "route": "stable"}
    assert (
        sample(
            metrics,
            "slipway_gateway_requests_total",
            **stable,
            code="DEADLINE_EXCEEDED",
            api="grpc",
        )
        == 1
    )


def test_latency_buckets_span_under_a_millisecond_to_ten_seconds_finely() -> None:
    assert LATENCY_BUCKETS[0] == 0.0004
    assert LATENCY_BUCKETS[-1] == 10.0
    assert list(LATENCY_BUCKETS) == sorted(LATENCY_BUCKETS)
    # a p99 half again as slow always crosses a bound
    assert all(upper / lower < 1.5 for lower, upper in itertools.pairwise(LATENCY_BUCKETS))
    metrics = GatewayMetrics()
    metrics.observe_request("digits", 1, "stable", "OK", "grpc", 0.0003)
    labels = {"model": "digits", "version": "1", "route": "stable"}
    assert sample(metrics, "slipway_gateway_request_seconds_bucket", **labels, le="0.0004") == 1
    assert sample(metrics, "slipway_gateway_request_seconds_bucket", **labels, le="10.0") == 1


def test_unknown_routes_are_refused() -> None:
    with pytest.raises(ValueError, match="route must be one of"):
        GatewayMetrics().observe_request("digits", 1, "Canary", "OK", "grpc", 0.1)


def test_a_batch_records_size_padding_and_per_request_timings() -> None:
    metrics = GatewayMetrics()
    metrics.observe_batch("digits", 1, "stable", 3, 4, [0.001, 0.002, 0.003], 0.02)
    version = {"model": "digits", "version": "1"}
    routed = {**version, "route": "stable"}
    assert sample(metrics, "slipway_gateway_batch_size_sum", **version) == 3
    assert sample(metrics, "slipway_gateway_batch_padding_ratio_sum", **version) == 0.25
    assert sample(metrics, "slipway_gateway_queue_seconds_count", **routed) == 3
    assert sample(metrics, "slipway_gateway_queue_seconds_sum", **routed) == pytest.approx(0.006)
    assert sample(metrics, "slipway_gateway_execution_seconds_count", **routed) == 3


def test_the_batch_observer_feeds_metrics_with_the_current_route() -> None:
    metrics = GatewayMetrics()
    route = {"now": "canary"}
    observer = metrics.batch_observer("digits", 2, lambda: route["now"])
    observer.on_batch(2, 2, [0.001, 0.001], 0.01)
    route["now"] = "stable"
    observer.on_batch(1, 1, [0.001], 0.01)
    observer.on_queue_depth(5)
    labels = {"model": "digits", "version": "2"}
    assert sample(metrics, "slipway_gateway_queue_seconds_count", **labels, route="canary") == 2
    assert sample(metrics, "slipway_gateway_queue_seconds_count", **labels, route="stable") == 1
    assert sample(metrics, "slipway_gateway_queue_depth", **labels) == 5


def test_in_flight_returns_to_zero_even_when_the_request_fails() -> None:
    metrics = GatewayMetrics()
    labels = {"model": "digits", "version": "1"}
    with pytest.raises(RuntimeError), metrics.track_in_flight("digits", 1):
        assert sample(metrics, "slipway_gateway_in_flight", **labels) == 1
        raise RuntimeError("boom")
    assert sample(metrics, "slipway_gateway_in_flight", **labels) == 0


def test_model_state_shadow_and_failover_series() -> None:
    metrics = GatewayMetrics()
    metrics.set_model_loaded("digits", 3, True)
    metrics.set_model_loaded("digits", 2, True)
    metrics.set_model_loaded("digits", 2, False)
    metrics.observe_shadow("digits", 3, "OK", agreement=0.9, abs_diff=0.002)
    metrics.observe_shadow("digits", 3, "INTERNAL")
    metrics.observe_failover("digits", 3, 2)
    assert sample(metrics, "slipway_gateway_model_loaded", model="digits", version="3") == 1
    assert sample(metrics, "slipway_gateway_model_loaded", model="digits", version="2") == 0
    shadow = {"model": "digits", "version": "3"}
    assert sample(metrics, "slipway_gateway_shadow_requests_total", **shadow, code="OK") == 1
    assert sample(metrics, "slipway_gateway_shadow_requests_total", **shadow, code="INTERNAL") == 1
    assert sample(metrics, "slipway_gateway_shadow_agreement_count", **shadow) == 1
    assert sample(metrics, "slipway_gateway_shadow_abs_diff_sum", **shadow) == 0.002
    failover = {"model": "digits", "from_version": "3", "to_version": "2"}
    assert sample(metrics, "slipway_gateway_failovers_total", **failover) == 1


def test_each_gateway_has_its_own_registry() -> None:
    first, second = GatewayMetrics(), GatewayMetrics()
    first.observe_request("digits", 1, "stable", "OK", "grpc", 0.1)
    labels = {"model": "digits", "version": "1", "route": "stable", "code": "OK", "api": "grpc"}
    assert sample(second, "slipway_gateway_requests_total", **labels) is None
    body, _ = second.render()
    assert b'model="digits"' not in body


def test_openmetrics_is_served_to_scrapers_that_ask_for_it() -> None:
    metrics = GatewayMetrics()
    metrics.observe_request("digits", 1, "stable", "OK", "grpc", 0.1)
    body, content_type = metrics.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")
    plain, plain_type = metrics.render("text/plain")
    assert plain_type.startswith("text/plain")
    assert b"# EOF" not in plain


def test_a_version_has_every_request_and_feedback_series_at_zero_before_any_event() -> None:
    metrics = GatewayMetrics()
    metrics.create_version_series("digits", 2)
    for route in ("stable", "canary", "shadow", "explicit"):
        labels = {"model": "digits", "version": "2", "route": route}
        for code in STATUS_CODES:
            for api in ("grpc", "rest"):
                assert sample(metrics, "slipway_gateway_requests_total", **labels, code=code,
                              api=api) == 0  # fmt: skip
        assert sample(metrics, "slipway_gateway_request_seconds_count", **labels) == 0
    for route in ("stable", "canary", "explicit"):
        labels = {"model": "digits", "version": "2", "route": route}
        for outcome in ("correct", "incorrect"):
            assert sample(metrics, "slipway_gateway_feedback_total", **labels, outcome=outcome) == 0
        assert sample(metrics, "slipway_gateway_feedback_absolute_error_count", **labels) == 0
    assert "UNAVAILABLE" in STATUS_CODES and "DEADLINE_EXCEEDED" in STATUS_CODES


def test_feedback_is_counted_by_outcome_and_regression_error_summed() -> None:
    metrics = GatewayMetrics()
    metrics.observe_feedback("digits", 2, "canary", correct=True)
    metrics.observe_feedback("digits", 2, "canary", correct=False)
    metrics.observe_feedback("digits", 2, "canary", correct=False)
    metrics.observe_absolute_error("digits", 1, "stable", 0.5)
    metrics.observe_absolute_error("digits", 1, "stable", 1.5)
    canary = {"model": "digits", "version": "2", "route": "canary"}
    assert sample(metrics, "slipway_gateway_feedback_total", **canary, outcome="correct") == 1
    assert sample(metrics, "slipway_gateway_feedback_total", **canary, outcome="incorrect") == 2
    stable = {"model": "digits", "version": "1", "route": "stable"}
    assert sample(metrics, "slipway_gateway_feedback_absolute_error_sum", **stable) == 2.0
    assert sample(metrics, "slipway_gateway_feedback_absolute_error_count", **stable) == 2


def test_prediction_log_outcomes_exist_from_the_start() -> None:
    metrics = GatewayMetrics()
    for outcome in ("written", "dropped", "failed"):
        assert sample(metrics, "slipway_gateway_prediction_log_records_total", outcome=outcome) == 0
    metrics.count_prediction_log("dropped")
    assert sample(metrics, "slipway_gateway_prediction_log_records_total", outcome="dropped") == 1
