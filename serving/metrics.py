"""Prometheus metrics of the gateway, on a registry of its own.

The registry is private to a ``GatewayMetrics`` instance so that several gateways in one
process (tests, benchmarks) never share or collide on series, and so that ``/metrics``
exposes exactly the gateway's metrics. Every request metric carries ``model``, ``version``
and ``route`` (``stable``, ``canary``, ``shadow``, ``explicit``) labels: the rollout
controller compares a canary with stable by selecting on ``route``.

A version's request and feedback series are created at 0 when it starts loading
(``create_version_series``): Prometheus' ``increase()`` cannot see the first sample of
a new series, so a canary's first errors would otherwise be undercounted. Series of a
version stay after it unloads, as its ``model_loaded`` gauge does (at 0).

In a pool of gateway processes (``slipway serve --processes N``) every worker writes its
values to files in ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's multiprocess mode) and
``/metrics`` of any worker reads them all: counters and histograms add up, and each gauge
says how its workers' values combine (``multiprocess_mode``), so a scrape that reaches any
one worker sees the whole gateway.

Label values never come from clients alone: a request for a version that has no series
(a version that does not exist, or a model that is not served) is counted under
``version="unknown"``, so clients naming made-up versions cannot grow ``/metrics``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector

# Set (by the pool's supervisor) before prometheus_client is first imported: workers then
# keep their values in files there, which ``render`` adds up.
MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

ROUTES = ("stable", "canary", "shadow", "explicit")
# Routes an answer a client received can take (a shadow answer is never served).
SERVED_ROUTES = ("stable", "canary", "explicit")
APIS = ("grpc", "rest")
# Every status a request can end with: a remote backend relays whatever its server said.
STATUS_CODES = tuple(code.name for code in grpc.StatusCode)
FEEDBACK_OUTCOMES = ("correct", "incorrect")
PREDICTION_LOG_OUTCOMES = ("written", "dropped", "failed")

# 0.4 ms to 10 s: a cached tiny model answers in well under a millisecond, a cold remote
# backend can take seconds; the rollout controller's latency SLOs sit in between. About
# sqrt(2) apart (1, 1.4, 2, 2.8, 4, 5.6, 8 per decade): a p99 that grows by half always
# crosses a bound, so the canary analysis can tell it from stable's (with bounds 2-2.5x
# apart, 32 ms -> 48 ms stayed inside one bucket and read as 42 ms -> 50 ms).
_MANTISSAS = (1.0, 1.4, 2.0, 2.8, 4.0, 5.6, 8.0)
LATENCY_BUCKETS = tuple(
    bound
    for exponent in range(-4, 2)
    for mantissa in _MANTISSAS
    if 0.0004 <= (bound := round(mantissa * 10.0**exponent, 6)) <= 10.0
)
# Powers of two, because allowed batch sizes usually are.
BATCH_SIZE_BUCKETS = tuple(float(2**power) for power in range(11))
RATIO_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)
AGREEMENT_BUCKETS = (0.0, 0.5, 0.8, 0.9, 0.95, 0.99, 1.0)
ABS_DIFF_BUCKETS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)
# Regression labels come in the model's own units: a wide, coarse spread.
ABS_ERROR_BUCKETS = (0.001, 0.01, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 100.0, 1000.0)

# The version label of requests that name no version this gateway has.
UNKNOWN_VERSION = "unknown"
# Where a client hung up before its answer was written: ``body`` while the gateway was
# still reading the request.
DISCONNECT_STAGES = ("body", "handling")

_REQUEST_LABELS = ("model", "version", "route")
_VERSION_LABELS = ("model", "version")


class GatewayMetrics:
    """All gateway metrics plus the helpers the request path calls.

    Helpers take plain values (an int version, a route string) so that callers never
    format label values themselves and every series of one version is spelled the same.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._pool_files = os.environ.get(MULTIPROCESS_DIR_ENV)
        registry = self.registry
        self.requests = Counter(
            "slipway_gateway_requests",
            "Requests answered, by model, version, route, status code and API (grpc or rest).",
            (*_REQUEST_LABELS, "code", "api"),
            registry=registry,
        )
        self.request_seconds = Histogram(
            "slipway_gateway_request_seconds",
            "End-to-end request latency: decoding, routing, queueing, execution and encoding.",
            _REQUEST_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue_seconds = Histogram(
            "slipway_gateway_queue_seconds",
            "Time a request waited in the batch queue before its batch started executing.",
            _REQUEST_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.execution_seconds = Histogram(
            "slipway_gateway_execution_seconds",
            "Model execution time of the batch a request was part of.",
            _REQUEST_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "slipway_gateway_batch_size",
            "Rows per executed batch, before padding to an allowed batch size.",
            _VERSION_LABELS,
            buckets=BATCH_SIZE_BUCKETS,
            registry=registry,
        )
        self.batch_padding_ratio = Histogram(
            "slipway_gateway_batch_padding_ratio",
            "Fraction of an executed batch made of padding rows (wasted compute).",
            _VERSION_LABELS,
            buckets=RATIO_BUCKETS,
            registry=registry,
        )
        self.queue_depth = Gauge(
            "slipway_gateway_queue_depth",
            "Batches waiting to execute (open and closed), bounded by max_enqueued_batches.",
            _VERSION_LABELS,
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.in_flight = Gauge(
            "slipway_gateway_in_flight",
            "Requests currently being served.",
            _VERSION_LABELS,
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.model_loaded = Gauge(
            "slipway_gateway_model_loaded",
            "1 while a model version is loaded and serving (in a pool of processes: in every "
            "worker), 0 once unloaded or failed.",
            _VERSION_LABELS,
            multiprocess_mode="livemin",
            registry=registry,
        )
        self.model_load_seconds = Gauge(
            "slipway_gateway_model_load_seconds",
            "Seconds the last load of a model version took, warm-up included.",
            _VERSION_LABELS,
            multiprocess_mode="livemax",
            registry=registry,
        )
        self.shadow_requests = Counter(
            "slipway_gateway_shadow_requests",
            "Mirrored requests sent to a shadow version, by its status code.",
            (*_VERSION_LABELS, "code"),
            registry=registry,
        )
        self.shadow_agreement = Histogram(
            "slipway_gateway_shadow_agreement",
            "Per mirrored request: fraction of rows whose top-1 class matches the primary answer.",
            _VERSION_LABELS,
            buckets=AGREEMENT_BUCKETS,
            registry=registry,
        )
        self.shadow_abs_diff = Histogram(
            "slipway_gateway_shadow_abs_diff",
            "Per mirrored request: mean absolute difference between shadow and primary outputs.",
            _VERSION_LABELS,
            buckets=ABS_DIFF_BUCKETS,
            registry=registry,
        )
        self.failovers = Counter(
            "slipway_gateway_failovers",
            "Requests retried on another version after the routed version failed.",
            ("model", "from_version", "to_version"),
            registry=registry,
        )
        self.feedback = Counter(
            "slipway_gateway_feedback",
            "Labels received for served classifications, by whether the served top-1 class "
            "was correct.",
            (*_REQUEST_LABELS, "outcome"),
            registry=registry,
        )
        self.feedback_absolute_error = Histogram(
            "slipway_gateway_feedback_absolute_error",
            "Labels received for served regressions: absolute error of the served value.",
            _REQUEST_LABELS,
            buckets=ABS_ERROR_BUCKETS,
            registry=registry,
        )
        self.prediction_log_records = Counter(
            "slipway_gateway_prediction_log_records",
            "Sampled requests for the prediction log: written, dropped (queue full, never "
            "blocking a request) or failed (the file could not be written).",
            ("outcome",),
            registry=registry,
        )
        for outcome in PREDICTION_LOG_OUTCOMES:
            self.prediction_log_records.labels(outcome)
        self.client_disconnects = Counter(
            "slipway_gateway_client_disconnects",
            "REST requests whose client closed the connection before the answer, by the "
            "stage the request was in (not an error of the gateway).",
            ("stage",),
            registry=registry,
        )
        for stage in DISCONNECT_STAGES:
            self.client_disconnects.labels(stage)
        self._versions: set[tuple[str, str]] = set()
        # Labelled children by (metric, label values): ``labels()`` validates and joins
        # its arguments on every call, a cost the request path pays several times.
        self._children: dict[tuple[object, tuple[str, ...]], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once. Bounded by the series that exist:
        label values here are validated versions, routes and codes, never raw input."""
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def create_version_series(self, model: str, version: int | str) -> None:
        """Create every request and feedback series ``version`` can have, at 0.

        Called before a version can answer: every route, status code and API of its
        request counter, its latency histograms, and its feedback metrics.
        """
        self._versions.add((model, str(version)))
        for route in ROUTES:
            labels = (model, str(version), route)
            for code in STATUS_CODES:
                for api in APIS:
                    self.requests.labels(*labels, code, api)
            self.request_seconds.labels(*labels)
        for route in SERVED_ROUTES:
            labels = (model, str(version), route)
            for outcome in FEEDBACK_OUTCOMES:
                self.feedback.labels(*labels, outcome)
            self.feedback_absolute_error.labels(*labels)

    def version_label(self, model: str, version: int | str | None) -> str:
        """``version`` as a label value if ``model`` has series for it, else ``unknown``."""
        if version is None or (model, str(version)) not in self._versions:
            return UNKNOWN_VERSION
        return str(version)

    def observe_disconnect(self, stage: str) -> None:
        self.client_disconnects.labels(stage).inc()

    def observe_request(
        self,
        model: str,
        version: int | str,
        route: str,
        code: str,
        api: str,
        seconds: float,
    ) -> None:
        """Count one answered request and its end-to-end latency.

        ``code`` is the gRPC status name (``OK``, ``INVALID_ARGUMENT``…) for both APIs, so
        error ratios do not depend on which API a client used.
        """
        _check_route(route)
        version = str(version)
        self._child(self.requests, model, version, route, code, api).inc()
        self._child(self.request_seconds, model, version, route).observe(seconds)

    def observe_batch(
        self,
        model: str,
        version: int | str,
        route: str,
        size: int,
        padded_size: int,
        queue_wait_seconds: Sequence[float],
        execution_seconds: float,
    ) -> None:
        """Record one executed batch: its size, padding, and each member request's timings."""
        _check_route(route)
        version = str(version)
        self._child(self.batch_size, model, version).observe(size)
        padding = (padded_size - size) / padded_size if padded_size else 0.0
        self._child(self.batch_padding_ratio, model, version).observe(padding)
        queue = self._child(self.queue_seconds, model, version, route)
        execution = self._child(self.execution_seconds, model, version, route)
        for wait in queue_wait_seconds:
            queue.observe(wait)
            execution.observe(execution_seconds)

    def set_queue_depth(self, model: str, version: int | str, depth: int) -> None:
        self.queue_depth.labels(model, str(version)).set(depth)

    def track_in_flight(self, model: str, version: int | str) -> AbstractContextManager[None]:
        """Count a request as in flight for the duration of the block, whatever its outcome."""
        return self._child(self.in_flight, model, str(version)).track_inprogress()

    def set_model_loaded(self, model: str, version: int | str, loaded: bool) -> None:
        self.model_loaded.labels(model, str(version)).set(1 if loaded else 0)

    def observe_model_load(self, model: str, version: int | str, seconds: float) -> None:
        self.model_load_seconds.labels(model, str(version)).set(seconds)

    def observe_shadow(
        self,
        model: str,
        version: int | str,
        code: str,
        *,
        agreement: float | None = None,
        abs_diff: float | None = None,
    ) -> None:
        """Record one mirrored request; comparisons are only present when it succeeded."""
        labels = (model, str(version))
        self.shadow_requests.labels(*labels, code).inc()
        if agreement is not None:
            self.shadow_agreement.labels(*labels).observe(agreement)
        if abs_diff is not None:
            self.shadow_abs_diff.labels(*labels).observe(abs_diff)

    def observe_failover(self, model: str, from_version: int | str, to_version: int | str) -> None:
        self.failovers.labels(model, str(from_version), str(to_version)).inc()

    def observe_feedback(
        self, model: str, version: int | str, route: str, *, correct: bool
    ) -> None:
        """Count one labelled row of a served classification."""
        outcome = FEEDBACK_OUTCOMES[0] if correct else FEEDBACK_OUTCOMES[1]
        self.feedback.labels(model, str(version), route, outcome).inc()

    def observe_absolute_error(
        self, model: str, version: int | str, route: str, error: float
    ) -> None:
        """Record one labelled row of a served regression."""
        self.feedback_absolute_error.labels(model, str(version), route).observe(error)

    def count_prediction_log(self, outcome: str) -> None:
        self.prediction_log_records.labels(outcome).inc()

    def batch_observer(
        self, model: str, version: int | str, route: str | Callable[[], str]
    ) -> BatchMetricsObserver:
        """An observer for one version's batcher (see ``serving.batching.BatchObserver``)."""
        return BatchMetricsObserver(self, model, version, route)

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition body and its content type for ``/metrics``.

        The ``Accept`` header picks the format: a scraper asking for OpenMetrics gets it, and
        anything else (or no header) gets the classic text format every Prometheus reads.
        """
        encoder, content_type = choose_encoder(accept or "")
        if self._pool_files is None:
            return encoder(self.registry), content_type
        every_worker = CollectorRegistry()
        MultiProcessCollector(every_worker, path=self._pool_files)
        return encoder(every_worker), content_type


class BatchMetricsObserver:
    """Feeds a batcher's callbacks into ``GatewayMetrics`` for one model version.

    A batch mixes requests of every route that reached the version, so queue and execution
    timings carry the route the version currently plays (``route`` may be a callable that
    reads it from the routing config at observation time).
    """

    def __init__(
        self,
        metrics: GatewayMetrics,
        model: str,
        version: int | str,
        route: str | Callable[[], str],
    ) -> None:
        self._metrics = metrics
        self._model = model
        self._version = version
        self._route = route

    def on_batch(
        self,
        size: int,
        padded_size: int,
        queue_wait_seconds: Sequence[float],
        execution_seconds: float,
    ) -> None:
        route = self._route() if callable(self._route) else self._route
        self._metrics.observe_batch(
            self._model,
            self._version,
            route,
            size,
            padded_size,
            queue_wait_seconds,
            execution_seconds,
        )

    def on_queue_depth(self, depth: int) -> None:
        self._metrics.set_queue_depth(self._model, self._version, depth)


def _check_route(route: str) -> None:
    """Refuse unknown route values: a typo would silently split a canary's series in two."""
    if route not in ROUTES:
        raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {route!r}")
