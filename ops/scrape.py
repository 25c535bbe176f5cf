"""Measurements straight from the gateways' ``/metrics``, for rollouts without a Prometheus.

A background thread scrapes every gateway at a fixed interval and keeps a bounded
history of the few series the analysis reads. ``measure`` scrapes once more (so the
window ends now), then computes each series' increase over the window the way
Prometheus' ``increase()`` treats counters: a value lower than the previous one is a
reset (the gateway restarted) and counts from zero. Unlike Prometheus there is no
extrapolation to the window edges, because the provider holds a sample at (or before)
the window start; and a series that appears between two scrapes started at zero, since
the gateway creates it on its first request. Increases are summed over the gateways.

Custom PromQL checks need a Prometheus: this provider leaves ``Measurement.custom``
empty, and the analysis skips those checks.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
import urllib.request
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from ops.measurement import Measurement, MetricsUnavailable, SideMeasurement

logger = logging.getLogger(__name__)

REQUESTS = "slipway_gateway_requests_total"
LATENCY_BUCKET = "slipway_gateway_request_seconds_bucket"
FAILOVERS = "slipway_gateway_failovers_total"
AGREEMENT_SUM = "slipway_gateway_shadow_agreement_sum"
AGREEMENT_COUNT = "slipway_gateway_shadow_agreement_count"
FEEDBACK = "slipway_gateway_feedback_total"
_KEPT = frozenset({REQUESTS, LATENCY_BUCKET, FAILOVERS, AGREEMENT_SUM, AGREEMENT_COUNT, FEEDBACK})

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]
"""Sample name and its sorted label pairs."""


@dataclass(frozen=True)
class _Snapshot:
    taken_at: float
    values: dict[SeriesKey, float]


class ScrapeProvider:
    """A ``MetricsProvider`` that scrapes the gateways itself.

    ``interval`` is the background scrape period (None: scrape only when measuring, which
    misses counter resets between two measurements). ``history_seconds`` bounds memory: a
    window longer than the history is measured over the history there is.
    """

    def __init__(
        self,
        gateway_urls: list[str],
        *,
        interval: float | None = 1.0,
        timeout: float = 2.0,
        history_seconds: float = 900.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not gateway_urls:
            raise ValueError("ScrapeProvider needs at least one gateway URL")
        self.metrics_urls = [_metrics_url(url) for url in gateway_urls]
        self.timeout = timeout
        self.history_seconds = history_seconds
        self._clock = clock
        self._history: dict[str, deque[_Snapshot]] = {url: deque() for url in self.metrics_urls}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if interval is not None:
            self._thread = threading.Thread(
                target=self._run, args=(interval,), name="slipway-metrics-scraper", daemon=True
            )
            self._thread.start()

    def scrape(self) -> dict[str, str]:
        """Scrape every gateway once; returns the error of each gateway that failed."""
        errors = {}
        with self._lock:
            for url in self.metrics_urls:
                try:
                    values = self._fetch(url)
                except MetricsUnavailable as exc:
                    errors[url] = str(exc)
                    continue
                self._record(url, _Snapshot(self._clock(), values))
        return errors

    @property
    def last_scraped(self) -> dict[str, float | None]:
        """Per ``/metrics`` URL, when it was last scraped successfully (None: never), so a
        status display can tell fresh numbers from a gateway that stopped answering."""
        with self._lock:
            return {
                url: history[-1].taken_at if history else None
                for url, history in self._history.items()
            }

    def measure(
        self, model: str, stable_version: int, canary_version: int, window_seconds: float
    ) -> Measurement:
        """Increases over the last ``window_seconds``; any gateway unreachable right now is
        MetricsUnavailable, because a partial sum would hide that replica's errors."""
        errors = self.scrape()
        if errors:
            raise MetricsUnavailable("; ".join(errors.values()))
        taken_at = self._clock()
        with self._lock:
            increases = _sum_increases(list(self._history.values()), taken_at - window_seconds)

        def side(version: int, route: str) -> SideMeasurement:
            selector = {"model": model, "version": str(version), "route": route}
            buckets: dict[float, float] = defaultdict(float)
            for labels, value in _select(increases, LATENCY_BUCKET, selector):
                buckets[float(labels["le"])] += value
            return SideMeasurement(
                version=version,
                requests=_total(increases, REQUESTS, selector),
                errors=sum(
                    value
                    for labels, value in _select(increases, REQUESTS, selector)
                    if labels.get("code") != "OK"
                ),
                latency_buckets=tuple(sorted(buckets.items())),
                failovers=_total(
                    increases, FAILOVERS, {"model": model, "from_version": str(version)}
                ),
                labelled=_total(increases, FEEDBACK, selector),
                correct=_total(increases, FEEDBACK, {**selector, "outcome": "correct"}),
            )

        shadow = {"model": model, "version": str(canary_version)}
        compared = _total(increases, AGREEMENT_COUNT, shadow)
        agreement = _total(increases, AGREEMENT_SUM, shadow) / compared if compared > 0 else None
        return Measurement(
            model=model,
            window_seconds=window_seconds,
            stable=side(stable_version, "stable"),
            canary=side(canary_version, "canary"),
            shadow_agreement=agreement,
            shadow_requests=compared,
            custom={},
            taken_at=taken_at,
        )

    def close(self) -> None:
        """Stop the background scraper and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 5)

    def _run(self, interval: float) -> None:
        while not self._stop.is_set():
            for url, error in self.scrape().items():
                logger.warning("scraping %s failed: %s", url, error)
            self._stop.wait(interval)

    def _fetch(self, url: str) -> dict[SeriesKey, float]:
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as response:
                text = response.read().decode("utf-8")
        except (OSError, http.client.HTTPException, UnicodeDecodeError) as exc:
            raise MetricsUnavailable(
                f"gateway metrics at {url} unreachable: {getattr(exc, 'reason', exc)}"
            ) from None
        try:
            return {
                (sample.name, tuple(sorted(sample.labels.items()))): float(sample.value)
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name in _KEPT
            }
        except Exception as exc:  # any garbage a target sends is its failure, not ours
            raise MetricsUnavailable(
                f"gateway metrics at {url} are not in the Prometheus text format: {exc}"
            ) from None

    def _record(self, url: str, snapshot: _Snapshot) -> None:
        """Append, then drop snapshots no window within the history can start from."""
        history = self._history[url]
        history.append(snapshot)
        cutoff = snapshot.taken_at - self.history_seconds
        while len(history) > 1 and history[1].taken_at <= cutoff:
            history.popleft()


def _sum_increases(histories: list[deque[_Snapshot]], start: float) -> dict[SeriesKey, float]:
    """Per series, the increase since ``start`` summed over gateways (resets handled).

    Each gateway's window begins at its last snapshot at or before ``start`` (or its
    oldest one); a series missing from a snapshot is zero there.
    """
    total: dict[SeriesKey, float] = defaultdict(float)
    for history in histories:
        snapshots = list(history)
        first = max((i for i, snap in enumerate(snapshots) if snap.taken_at <= start), default=0)
        for previous, current in zip(snapshots[first:], snapshots[first + 1 :], strict=False):
            for key, value in current.values.items():
                before = previous.values.get(key, 0.0)
                total[key] += value - before if value >= before else value
    return total


def _select(
    increases: dict[SeriesKey, float], name: str, selector: dict[str, str]
) -> list[tuple[dict[str, str], float]]:
    selected = []
    for (sample_name, pairs), value in increases.items():
        labels = dict(pairs)
        if sample_name == name and all(
            labels.get(key) == wanted for key, wanted in selector.items()
        ):
            selected.append((labels, value))
    return selected


def _total(increases: dict[SeriesKey, float], name: str, selector: dict[str, str]) -> float:
    return sum(value for _, value in _select(increases, name, selector))


def _metrics_url(url: str) -> str:
    """A gateway's base URL (``http://host:8501``) or its full ``/metrics`` URL."""
    url = url.rstrip("/")
    return url if url.endswith("/metrics") else f"{url}/metrics"
