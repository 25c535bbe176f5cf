"""What a metrics provider reports about a canary and its stable version over one window.

Both providers (a Prometheus server, or the embedded scraper of the gateways' ``/metrics``)
produce exactly this shape, so the analysis never knows where the numbers came from and
the controller can switch providers without touching its decisions. Every number is an
*increase* over the window (not a rate) because the statistical tests need counts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class SideMeasurement:
    """One side of the comparison (stable or canary) over the window.

    ``latency_buckets`` holds ``(le, cumulative count increase)`` pairs sorted by ``le``
    with ``le == inf`` last, as a Prometheus histogram exposes them, so p99 is computed
    with ``histogram_quantile`` semantics. ``failovers`` counts requests retried away from
    this version: a canary that keeps failing over looks healthy in its own error rate.
    ``labelled`` counts predictions whose true label came back through the feedback API
    and ``correct`` those whose top-1 class matched it; both stay 0 for a model without
    feedback.
    """

    version: int
    requests: float
    errors: float
    latency_buckets: tuple[tuple[float, float], ...]
    failovers: float
    labelled: float = 0.0
    correct: float = 0.0

    @property
    def error_rate(self) -> float | None:
        """Errors per request; None when there were no requests (no rate to speak of)."""
        return self.errors / self.requests if self.requests > 0 else None

    @property
    def accuracy(self) -> float | None:
        """Correct per labelled prediction; None without labels."""
        return min(self.correct, self.labelled) / self.labelled if self.labelled > 0 else None

    def to_json(self) -> dict[str, Any]:
        """The side as plain JSON values (kept in the rollout state as a baseline)."""
        buckets = [[str(le), count] for le, count in self.latency_buckets]  # JSON has no inf
        return {**dataclasses.asdict(self), "latency_buckets": buckets}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SideMeasurement:
        """The side ``to_json`` wrote."""
        buckets = tuple((float(le), float(count)) for le, count in data["latency_buckets"])
        return cls(**{**data, "latency_buckets": buckets})


@dataclass(frozen=True)
class Measurement:
    """Everything the analysis judges for one model at one point in time.

    ``shadow_agreement`` is None when no mirrored request was compared in the window, so
    the shadow check is skipped rather than failed. ``custom`` holds the results of the
    analysis file's custom queries by name (None when the provider cannot evaluate them or
    the query returned nothing).
    """

    model: str
    window_seconds: float
    stable: SideMeasurement
    canary: SideMeasurement
    shadow_agreement: float | None
    shadow_requests: float
    custom: dict[str, float | None]
    taken_at: float


class MetricsUnavailable(Exception):
    """The provider could not measure (unreachable, bad response, query error).

    It is an outcome of its own, distinct from "no traffic": the controller holds and
    retries rather than judging a canary on numbers it does not have.
    """


class MetricsProvider(Protocol):
    """Where measurements come from; implementations raise MetricsUnavailable on failure."""

    def measure(
        self, model: str, stable_version: int, canary_version: int, window_seconds: float
    ) -> Measurement: ...

    def close(self) -> None: ...
