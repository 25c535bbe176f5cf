"""The embedded scraper: increases over a window from several real ``/metrics`` endpoints."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator

import pytest

from ops.analysis import AnalysisConfig, judge
from ops.measurement import MetricsUnavailable
from ops.scrape import ScrapeProvider
from serving.metrics import LATENCY_BUCKETS
from tests.support.clocks import FakeClock
from tests.support.fake_gateway import FakeGateway
from tests.support.ports import free_port
from tests.support.waiting import wait_until

MODEL = "digits"
STABLE, CANARY = 1, 2


@pytest.fixture
def gateways() -> Iterator[tuple[FakeGateway, FakeGateway]]:
    with FakeGateway() as first, FakeGateway() as second:
        yield first, second


def cumulative(seconds: list[float]) -> tuple[tuple[float, float], ...]:
    return tuple(
        (bound, float(sum(s <= bound for s in seconds))) for bound in (*LATENCY_BUCKETS, math.inf)
    )


def test_increases_sum_over_gateways_and_survive_a_counter_reset(
    gateways: tuple[FakeGateway, FakeGateway],
) -> None:
    a, b = gateways
    clock = FakeClock()
    provider = ScrapeProvider([a.url, f"{b.url}/metrics"], interval=None, clock=clock)
    provider.scrape()  # t=1000: nothing served yet

    a.record(MODEL, CANARY, "canary", 10, seconds=0.004)
    a.record(MODEL, CANARY, "canary", 2, code="UNAVAILABLE", seconds=0.2)
    a.record(MODEL, STABLE, "stable", 100, seconds=0.002)
    b.record(MODEL, CANARY, "canary", 5, seconds=0.04)
    b.record(MODEL, STABLE, "stable", 50, seconds=0.002)
    b.record(MODEL, STABLE, "stable", 1, code="INTERNAL", seconds=0.002)
    clock.now = 1_010.0
    provider.scrape()

    a.restart_counters()  # gateway a restarts: its counters start again from zero
    a.record(MODEL, CANARY, "canary", 3, seconds=0.004)
    clock.now = 1_020.0
    provider.scrape()

    b.record(MODEL, CANARY, "canary", 4, seconds=0.004)
    clock.now = 1_030.0
    whole = provider.measure(MODEL, STABLE, CANARY, 60.0)  # from the t=1000 scrape

    assert whole.taken_at == 1_030.0 and whole.window_seconds == 60.0
    assert whole.canary.requests == 10 + 2 + 3 + 5 + 4
    assert whole.canary.errors == 2
    assert whole.stable.requests == 151 and whole.stable.errors == 1
    assert whole.canary.latency_buckets == cumulative([0.004] * 17 + [0.2] * 2 + [0.04] * 5)
    assert whole.stable.latency_buckets == cumulative([0.002] * 151)

    recent = provider.measure(MODEL, STABLE, CANARY, 15.0)  # from the t=1010 scrape
    assert recent.canary.requests == 3 + 4  # after the reset a counts from zero
    assert recent.canary.errors == 0
    assert recent.stable.requests == 0
    provider.close()


def test_failovers_shadow_comparisons_and_other_routes(
    gateways: tuple[FakeGateway, FakeGateway],
) -> None:
    a, b = gateways
    clock = FakeClock()
    provider = ScrapeProvider([a.url, b.url], interval=None, clock=clock)
    provider.scrape()
    a.record(MODEL, CANARY, "canary", 60)
    a.record(MODEL, CANARY, "explicit", 500)  # pinned clients are neither side
    a.record("other", CANARY, "canary", 70)  # another model's canary
    for _ in range(3):
        a.metrics.observe_failover(MODEL, CANARY, STABLE)
    b.metrics.observe_failover(MODEL, CANARY, STABLE)
    for agreement in (1.0, 1.0, 0.5):
        a.metrics.observe_shadow(MODEL, CANARY, "OK", agreement=agreement, abs_diff=0.0)
    b.metrics.observe_shadow(MODEL, CANARY, "OK", agreement=0.9, abs_diff=0.0)
    clock.now += 30
    measurement = provider.measure(MODEL, STABLE, CANARY, 30.0)

    assert measurement.canary.requests == 60
    assert measurement.canary.failovers == 4
    assert measurement.stable.failovers == 0
    assert measurement.shadow_requests == 4
    assert measurement.shadow_agreement == pytest.approx((1.0 + 1.0 + 0.5 + 0.9) / 4)
    assert measurement.custom == {}
    provider.close()


def test_label_feedback_is_counted_per_side(gateways: tuple[FakeGateway, FakeGateway]) -> None:
    a, b = gateways
    clock = FakeClock()
    provider = ScrapeProvider([a.url, b.url], interval=None, clock=clock)
    a.feedback_for(MODEL, STABLE, "stable", correct=5, incorrect=1)  # before the window
    provider.scrape()
    a.feedback_for(MODEL, STABLE, "stable", correct=90, incorrect=10)
    b.feedback_for(MODEL, CANARY, "canary", correct=30, incorrect=10)
    a.feedback_for(MODEL, CANARY, "explicit", correct=0, incorrect=50)  # neither side
    clock.now += 30
    measurement = provider.measure(MODEL, STABLE, CANARY, 30.0)
    assert (measurement.stable.labelled, measurement.stable.correct) == (100, 90)
    assert (measurement.canary.labelled, measurement.canary.correct) == (40, 30)
    assert measurement.canary.accuracy == pytest.approx(0.75)
    provider.close()


def test_custom_checks_are_skipped_with_the_scraper(
    gateways: tuple[FakeGateway, FakeGateway],
) -> None:
    a, _ = gateways
    clock = FakeClock()
    provider = ScrapeProvider([a.url], interval=None, clock=clock)
    provider.scrape()
    a.record(MODEL, STABLE, "stable", 500, seconds=0.004)
    a.record(MODEL, CANARY, "canary", 100, seconds=0.004)
    clock.now += 30
    config = AnalysisConfig(checks={"custom": [{"name": "depth", "query": "max(q)", "max": 1}]})
    verdict = judge(provider.measure(MODEL, STABLE, CANARY, 30.0), config)
    assert verdict.outcome == "pass", verdict.message
    (custom,) = [check for check in verdict.checks if check.name == "depth"]
    assert custom.skipped
    provider.close()


def test_a_window_longer_than_the_history_uses_what_there_is(
    gateways: tuple[FakeGateway, FakeGateway],
) -> None:
    a, _ = gateways
    clock = FakeClock()
    provider = ScrapeProvider([a.url], interval=None, clock=clock, history_seconds=20.0)
    provider.scrape()  # t=1000, later pruned: no window can start before t=1010 any more
    a.record(MODEL, CANARY, "canary", 8)
    clock.now = 1_010.0
    provider.scrape()
    a.record(MODEL, CANARY, "canary", 5)
    clock.now = 1_040.0
    assert provider.measure(MODEL, STABLE, CANARY, 3600.0).canary.requests == 5
    provider.close()


def test_an_unreachable_gateway_makes_the_measurement_unavailable(
    gateways: tuple[FakeGateway, FakeGateway],
) -> None:
    a, _ = gateways
    dead = f"http://127.0.0.1:{free_port()}"
    provider = ScrapeProvider([a.url, dead], interval=None, timeout=2.0)
    errors = provider.scrape()
    assert list(errors) == [f"{dead}/metrics"]
    with pytest.raises(MetricsUnavailable, match=rf"{dead}/metrics unreachable"):
        provider.measure(MODEL, STABLE, CANARY, 30.0)
    assert provider.last_scraped[f"{dead}/metrics"] is None
    assert provider.last_scraped[f"{a.url}/metrics"] is not None
    provider.close()


def test_the_background_scraper_catches_a_reset_between_two_measurements(
    gateways: tuple[FakeGateway, FakeGateway],
) -> None:
    a, _ = gateways
    url = f"{a.url}/metrics"
    provider = ScrapeProvider([a.url], interval=0.02)

    def wait_for_a_scrape_started_now() -> None:
        """A scrape that began after this call (the second to finish after it)."""
        started = time.time()
        wait_until(lambda: (provider.last_scraped[url] or 0) > started, "a scrape", 10)
        first = provider.last_scraped[url]
        wait_until(lambda: provider.last_scraped[url] > first, "a second scrape", 10)

    wait_for_a_scrape_started_now()
    a.record(MODEL, CANARY, "canary", 10)
    wait_for_a_scrape_started_now()
    a.restart_counters()
    a.record(MODEL, CANARY, "canary", 3)
    wait_for_a_scrape_started_now()
    a.record(MODEL, CANARY, "canary", 12)  # now 15, above the 10 before the reset
    # Measuring only now would see 0 -> 10 -> 15 and count 15; the history saw the reset.
    assert provider.measure(MODEL, STABLE, CANARY, 600.0).canary.requests == 10 + 3 + 12
    provider.close()
    assert not [t for t in threading.enumerate() if t.name == "slipway-metrics-scraper"]


def test_at_least_one_gateway_is_needed() -> None:
    with pytest.raises(ValueError, match="at least one gateway"):
        ScrapeProvider([])
