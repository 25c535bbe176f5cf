"""The Prometheus provider against a real Prometheus scraping a fake gateway endpoint."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from ops import stats
from ops.analysis import AnalysisConfig
from ops.measurement import MetricsUnavailable
from ops.prometheus import PrometheusClient, PrometheusProvider, PromQLError, validate_queries
from serving.metrics import LATENCY_BUCKETS
from tests.support.fake_gateway import FakeGateway
from tests.support.ports import free_port
from tests.support.prometheus import PrometheusProcess

MODEL = "digits"
STABLE, CANARY = 1, 2
WINDOW = 300.0  # longer than the test: every series' first (zero) sample is inside it

# (version, route, code, seconds, count): the traffic the fake gateway reports
TRAFFIC = [
    (STABLE, "stable", "OK", 0.003, 200),
    (STABLE, "stable", "OK", 0.02, 80),
    (STABLE, "stable", "OK", 0.07, 18),
    (STABLE, "stable", "INTERNAL", 0.003, 2),
    (CANARY, "canary", "OK", 0.004, 100),
    (CANARY, "canary", "OK", 0.04, 40),
    (CANARY, "canary", "UNAVAILABLE", 0.2, 6),
    (CANARY, "explicit", "OK", 0.001, 50),  # pinned clients: counts for neither side
]
CANARY_FAILOVERS = 4
# (version, route, correct, incorrect): labels the feedback API received
FEEDBACK = [(STABLE, "stable", 270, 30), (CANARY, "canary", 100, 25), (CANARY, "explicit", 0, 9)]
SHADOW_AGREEMENTS = [1.0] * 10 + [0.5] * 10


@dataclass
class Env:
    gateway: FakeGateway
    prometheus: PrometheusProcess
    at: float  # timestamp of the scrape that saw all of TRAFFIC


def expected_buckets(version: int, route: str) -> tuple[tuple[float, float], ...]:
    seconds = [s for v, r, _, s, n in TRAFFIC if (v, r) == (version, route) for _ in range(n)]
    return tuple(
        (bound, float(sum(s <= bound for s in seconds))) for bound in (*LATENCY_BUCKETS, math.inf)
    )


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    with FakeGateway() as gateway:
        metrics = gateway.metrics
        # Every series exists at zero before the first scrape, so increase() counts all of it.
        for version, route, code, _, _ in TRAFFIC:
            gateway.declare(MODEL, version, route, (code,))
        metrics.failovers.labels(MODEL, str(CANARY), str(STABLE))
        metrics.shadow_agreement.labels(MODEL, str(CANARY))
        for version, route, _, _ in FEEDBACK:  # created at 0 when the version loads
            gateway.feedback_for(MODEL, version, route)
        with PrometheusProcess([gateway.target], scrape_interval="1s") as prometheus:
            series = len({(version, route, code) for version, route, code, _, _ in TRAFFIC})
            prometheus.wait_until(
                f'count(slipway_gateway_requests_total{{model="{MODEL}"}}) == {series}'
            )
            for version, route, code, seconds, count in TRAFFIC:
                gateway.record(MODEL, version, route, count, code=code, seconds=seconds)
            for _ in range(CANARY_FAILOVERS):
                metrics.observe_failover(MODEL, CANARY, STABLE)
            for agreement in SHADOW_AGREEMENTS:
                metrics.observe_shadow(MODEL, CANARY, "OK", agreement=agreement, abs_diff=0.0)
            for version, route, correct, incorrect in FEEDBACK:
                gateway.feedback_for(MODEL, version, route, correct=correct, incorrect=incorrect)
            total = sum(count for *_, count in TRAFFIC)
            # One scrape carries everything recorded before it: once the total is there, all is.
            prometheus.wait_until(
                f'sum(slipway_gateway_requests_total{{model="{MODEL}"}}) == {total}'
            )
            (sample,) = prometheus.query(
                f'max(timestamp(slipway_gateway_requests_total{{model="{MODEL}"}}))'
            )
            yield Env(gateway, prometheus, sample.value)


@pytest.mark.process
def test_measurement_equals_the_known_increases(env: Env) -> None:
    analysis = AnalysisConfig(
        checks={
            "custom": [
                {
                    "name": "pinned",
                    "query": 'sum(increase(slipway_gateway_requests_total{model="{model}",'
                    'version="{version}",route="explicit"}[{window}]))',
                    "max": 1000,
                }
            ]
        }
    )
    provider = PrometheusProvider(env.prometheus.client, analysis)
    measurement = provider.measure(MODEL, STABLE, CANARY, WINDOW, at=env.at)

    assert measurement.taken_at == env.at and measurement.window_seconds == WINDOW
    assert measurement.stable.version == STABLE
    assert measurement.stable.requests == pytest.approx(300)
    assert measurement.stable.errors == pytest.approx(2)
    assert measurement.stable.failovers == 0
    assert measurement.canary.requests == pytest.approx(146)
    assert measurement.canary.errors == pytest.approx(6)
    assert measurement.canary.failovers == pytest.approx(CANARY_FAILOVERS)
    assert measurement.stable.labelled == pytest.approx(300)
    assert measurement.stable.correct == pytest.approx(270)
    assert measurement.canary.labelled == pytest.approx(125)
    assert measurement.canary.correct == pytest.approx(100)
    for side, route in ((measurement.stable, "stable"), (measurement.canary, "canary")):
        expected = expected_buckets(side.version, route)
        assert [bound for bound, _ in side.latency_buckets] == [bound for bound, _ in expected]
        assert [count for _, count in side.latency_buckets] == pytest.approx(
            [count for _, count in expected]
        )
    assert measurement.shadow_requests == pytest.approx(len(SHADOW_AGREEMENTS))
    assert measurement.shadow_agreement == pytest.approx(0.75)
    assert measurement.custom == {"pinned": pytest.approx(50)}


@pytest.mark.process
def test_a_version_without_traffic_measures_zero(env: Env) -> None:
    provider = PrometheusProvider(env.prometheus.client, AnalysisConfig())
    measurement = provider.measure(MODEL, STABLE, 9, WINDOW, at=env.at)
    assert (measurement.canary.requests, measurement.canary.errors) == (0.0, 0.0)
    assert measurement.canary.latency_buckets == ()
    assert measurement.shadow_agreement is None and measurement.shadow_requests == 0.0


@pytest.mark.process
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_histogram_quantile_matches_prometheus(env: Env, q: float) -> None:
    provider = PrometheusProvider(env.prometheus.client, AnalysisConfig())
    measurement = provider.measure(MODEL, STABLE, CANARY, WINDOW, at=env.at)
    for side, route in ((measurement.stable, "stable"), (measurement.canary, "canary")):
        promql = (
            f"histogram_quantile({q}, sum by (le) (increase(slipway_gateway_request_seconds_bucket"
            f'{{model="{MODEL}",version="{side.version}",route="{route}"}}[{WINDOW:.0f}s])))'
        )
        (expected,) = env.prometheus.query(promql, at=env.at)
        assert stats.histogram_quantile(q, side.latency_buckets) == pytest.approx(
            expected.value, rel=1e-12
        )


@pytest.mark.process
def test_range_query_returns_the_series(env: Env) -> None:
    (series,) = env.prometheus.client.query_range(
        f'sum(slipway_gateway_requests_total{{model="{MODEL}"}})', env.at - 2, env.at, 1
    )
    assert [t for t, _ in series.points][-1] == pytest.approx(env.at)
    assert series.points[-1][1] == sum(count for *_, count in TRAFFIC)


@pytest.mark.process
@pytest.mark.parametrize(
    ("promql", "prometheus_says"),
    [
        ("sum(", "parse error"),
        ("rate(up)", 'expected type range vector in call to function "rate"'),
    ],
)
def test_a_promql_error_carries_prometheus_message(
    env: Env, promql: str, prometheus_says: str
) -> None:
    with pytest.raises(PromQLError) as raised:
        env.prometheus.client.query(promql)
    assert prometheus_says in str(raised.value)
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, MetricsUnavailable)


@pytest.mark.process
def test_validate_queries_names_the_broken_template(env: Env) -> None:
    validate_queries(env.prometheus.client, AnalysisConfig())  # the defaults are valid PromQL
    broken = AnalysisConfig(checks={"custom": [{"name": "broken", "query": "rate(up)", "max": 1}]})
    with pytest.raises(PromQLError, match=r"^checks\.custom\.broken: .*expected type range vector"):
        validate_queries(env.prometheus.client, broken)


@pytest.mark.process
def test_a_template_that_does_not_aggregate_is_unavailable_not_a_crash(env: Env) -> None:
    analysis = AnalysisConfig(
        checks={
            "custom": [
                {
                    "name": "raw",
                    "query": 'slipway_gateway_requests_total{model="{model}",version="{version}",route="canary"}',
                    "max": 1,
                }
            ]
        }
    )
    provider = PrometheusProvider(env.prometheus.client, analysis)
    with pytest.raises(MetricsUnavailable, match=r"query raw returned 2 series; .*sum\(\.\.\.\)"):
        provider.measure(MODEL, STABLE, CANARY, WINDOW, at=env.at)


def test_an_unreachable_prometheus_is_metrics_unavailable() -> None:
    client = PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout=2.0)
    assert client.ready() is False
    provider = PrometheusProvider(client, AnalysisConfig())
    with pytest.raises(MetricsUnavailable, match="is unreachable") as raised:
        provider.measure(MODEL, STABLE, CANARY, 30.0)
    assert not isinstance(raised.value, PromQLError)


@pytest.mark.process
def test_an_outage_is_unavailable_and_a_restart_recovers_the_data(env: Env) -> None:
    provider = PrometheusProvider(env.prometheus.client, AnalysisConfig())
    before = provider.measure(MODEL, STABLE, CANARY, WINDOW, at=env.at)
    env.prometheus.stop()
    with pytest.raises(MetricsUnavailable, match="is unreachable"):
        provider.measure(MODEL, STABLE, CANARY, WINDOW, at=env.at)
    env.prometheus.start()
    assert provider.measure(MODEL, STABLE, CANARY, WINDOW, at=env.at) == before


def test_a_server_that_is_not_prometheus_is_metrics_unavailable() -> None:
    with FakeGateway() as gateway:
        client = PrometheusClient(gateway.url)  # answers every path with exposition text
        with pytest.raises(MetricsUnavailable, match="not JSON"):
            client.query("up")
