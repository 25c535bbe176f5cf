"""Measurements from a Prometheus server that scrapes the gateways.

The provider renders the analysis file's PromQL templates once per side and evaluates
them all at one timestamp, so the stable and canary numbers of a measurement describe
the same window. Two kinds of failure are kept apart: Prometheus being unreachable or
unwell (``MetricsUnavailable``: the controller holds and retries) and a query Prometheus
refuses (``PromQLError``: a mistake in the analysis file, reported with Prometheus' own
message so it can be fixed).
"""

from __future__ import annotations

import http.client
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ops.analysis import AnalysisConfig, render
from ops.measurement import Measurement, MetricsUnavailable, SideMeasurement

STABLE_ROUTE = "stable"
CANARY_ROUTE = "canary"
SHADOW_ROUTE = "shadow"


class PromQLError(MetricsUnavailable, ValueError):
    """Prometheus rejected a query (``errorType`` bad_data): the query is wrong, not the server.

    It is a ``MetricsUnavailable`` too, so a controller measuring in a loop holds instead
    of crashing; validating the analysis file up front (``validate_queries``) is where
    it surfaces as a configuration error.
    """


@dataclass(frozen=True)
class Sample:
    """One element of an instant vector (a scalar result has no labels)."""

    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Series:
    """One series of a range query."""

    labels: dict[str, str]
    points: list[tuple[float, float]]


class PrometheusClient:
    """The few endpoints of the Prometheus HTTP API the rollout needs."""

    def __init__(self, base_url: str, timeout: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def ready(self) -> bool:
        """Whether Prometheus answers ``/-/ready`` with 200 (started and able to serve queries)."""
        try:
            with urllib.request.urlopen(
                f"{self.base_url}/-/ready", timeout=self.timeout
            ) as response:
                return response.status == 200
        except (OSError, http.client.HTTPException):
            return False

    def query(self, promql: str, *, at: float | None = None) -> list[Sample]:
        """Evaluate an instant query (at ``at``, unix seconds, or now).

        Values arrive as strings ("NaN" and "+Inf" included), which ``float`` reads.
        """
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        with _malformed(self.base_url):
            kind, result = data["resultType"], data["result"]
            if kind == "scalar":
                return [Sample({}, float(result[1]))]
            if kind == "vector":
                return [Sample(dict(item["metric"]), float(item["value"][1])) for item in result]
        raise MetricsUnavailable(
            f"query {promql!r} returned a {kind} result, expected a vector or scalar"
        )

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[Series]:
        """Evaluate a range query from ``start`` to ``end`` every ``step`` seconds."""
        params = {
            "query": promql,
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": f"{step:g}",
        }
        data = self._get("/api/v1/query_range", params)
        with _malformed(self.base_url):
            if data["resultType"] == "matrix":
                return [
                    Series(dict(item["metric"]), [(float(t), float(v)) for t, v in item["values"]])
                    for item in data["result"]
                ]
        raise MetricsUnavailable(
            f"range query {promql!r} returned a {data['resultType']} result, expected a matrix"
        )

    def _get(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            # Query errors come back as 400/422/503 with the reason in the JSON body.
            body = exc.read()
            if not body:
                raise MetricsUnavailable(
                    f"Prometheus at {self.base_url}: HTTP {exc.code}"
                ) from None
        except (OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            raise MetricsUnavailable(
                f"Prometheus at {self.base_url} is unreachable: {reason}"
            ) from None
        try:
            payload = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise MetricsUnavailable(
                f"Prometheus at {self.base_url} sent a response that is not JSON"
            ) from None
        if not isinstance(payload, dict):
            raise MetricsUnavailable(f"Prometheus at {self.base_url} sent an unexpected response")
        if payload.get("status") != "success":
            kind, message = payload.get("errorType", "unknown"), payload.get("error", "no message")
            if kind == "bad_data":
                raise PromQLError(f"{message} (query: {params['query']})")
            raise MetricsUnavailable(f"Prometheus at {self.base_url}: {kind}: {message}")
        with _malformed(self.base_url):
            return dict(payload["data"])


@contextmanager
def _malformed(base_url: str) -> Iterator[None]:
    """A response that is JSON but not the shape the API documents is an unwell server."""
    try:
        yield
    except (KeyError, IndexError, TypeError, ValueError):
        raise MetricsUnavailable(f"Prometheus at {base_url} sent an unexpected response") from None


class PrometheusProvider:
    """A ``MetricsProvider`` over the analysis file's PromQL templates."""

    def __init__(self, client: PrometheusClient, analysis: AnalysisConfig) -> None:
        self.client = client
        self.analysis = analysis

    def measure(
        self,
        model: str,
        stable_version: int,
        canary_version: int,
        window_seconds: float,
        *,
        at: float | None = None,
    ) -> Measurement:
        """Every query evaluated at ``at`` (default: now), so both sides share one window."""
        taken_at = time.time() if at is None else at
        queries = self.analysis.queries

        def value(name: str, template: str, version: int, route: str) -> float | None:
            promql = render(
                template, model=model, version=version, route=route, window_seconds=window_seconds
            )
            return _single_value(name, self.client.query(promql, at=taken_at))

        def side(version: int, route: str) -> SideMeasurement:
            buckets_query = render(
                queries.latency_buckets,
                model=model,
                version=version,
                route=route,
                window_seconds=window_seconds,
            )
            return SideMeasurement(
                version=version,
                requests=value("requests", queries.requests, version, route) or 0.0,
                errors=value("errors", queries.errors, version, route) or 0.0,
                latency_buckets=_buckets(self.client.query(buckets_query, at=taken_at)),
                failovers=value("failovers", queries.failovers, version, route) or 0.0,
                labelled=value("labelled", queries.labelled, version, route) or 0.0,
                correct=value("correct", queries.correct, version, route) or 0.0,
            )

        return Measurement(
            model=model,
            window_seconds=window_seconds,
            stable=side(stable_version, STABLE_ROUTE),
            canary=side(canary_version, CANARY_ROUTE),
            shadow_agreement=value(
                "shadow_agreement", queries.shadow_agreement, canary_version, SHADOW_ROUTE
            ),
            shadow_requests=value(
                "shadow_requests", queries.shadow_requests, canary_version, SHADOW_ROUTE
            )
            or 0.0,
            custom={
                check.name: value(check.name, check.query, canary_version, CANARY_ROUTE)
                for check in self.analysis.checks.custom
            },
            taken_at=taken_at,
        )

    def close(self) -> None:
        """Nothing to release: every query is its own HTTP request."""


def validate_queries(client: PrometheusClient, analysis: AnalysisConfig) -> None:
    """Send every rendered template once, so a PromQL mistake stops a rollout before it starts.

    The error names the template (``queries.errors: …`` or ``checks.custom.NAME: …``)
    and carries Prometheus' message. An unreachable Prometheus raises MetricsUnavailable.
    """
    queries = analysis.queries
    templates = [
        *(
            (f"queries.{name}", getattr(queries, name), CANARY_ROUTE)
            for name in type(queries).model_fields
        ),
        *(
            (f"checks.custom.{check.name}", check.query, CANARY_ROUTE)
            for check in analysis.checks.custom
        ),
    ]
    for where, template, route in templates:
        promql = render(
            template, model="validate", version=0, route=route, window_seconds=analysis.window
        )
        try:
            client.query(promql)
        except PromQLError as exc:
            raise PromQLError(f"{where}: {exc}") from None


def _single_value(name: str, samples: list[Sample]) -> float | None:
    """The one value a template must produce; None when there is no series (no traffic yet)
    or the value is NaN (a ratio of nothing)."""
    if not samples:
        return None
    if len(samples) > 1:
        raise MetricsUnavailable(
            f"query {name} returned {len(samples)} series; a template must aggregate to one "
            "value, e.g. with sum(...)"
        )
    return None if math.isnan(samples[0].value) else samples[0].value


def _buckets(samples: list[Sample]) -> tuple[tuple[float, float], ...]:
    """``(le, count)`` pairs sorted by bound, from a vector aggregated ``by (le)``."""
    try:
        buckets = sorted((float(sample.labels["le"]), sample.value) for sample in samples)
    except (KeyError, ValueError):
        raise MetricsUnavailable(
            "query latency_buckets must return one series per `le` label"
        ) from None
    return tuple((bound, count) for bound, count in buckets if not math.isnan(count))
