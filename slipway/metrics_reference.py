"""The metrics reference (``docs/reference/metrics.md``), read from the code's declarations.

Every Prometheus metric a Slipway process exports, with its type, labels, meaning (its
HELP text) and, for a histogram, its buckets. Each exporter's metrics are declared on a
fresh ``CollectorRegistry`` exactly as the process declares them, and read back, so the
reference cannot drift from what ``/metrics`` serves: ``tests/docs/test_reference_pages.py``
fails when the committed page and this output differ. Regenerate it with::

    python -m slipway.metrics_reference > docs/reference/metrics.md

Label values come from the constants the code labels series with (``LABELS``), and a
test checks that every label of every metric is explained there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from contracts.config_reference import cell
from ops.controller import STATE_LABELS, ControllerMetrics
from serving.metrics import (
    APIS,
    DISCONNECT_STAGES,
    FEEDBACK_OUTCOMES,
    PREDICTION_LOG_OUTCOMES,
    ROUTES,
    UNKNOWN_VERSION,
    GatewayMetrics,
)
from serving.routing_store import RoutingStore


def _values(values: tuple[str, ...]) -> str:
    return ", ".join(f"`{value}`" for value in values)


# What each label means, and the values the code gives it.
LABELS: dict[str, str] = {
    "model": "the model's name",
    "version": f"the model version, or `{UNKNOWN_VERSION}` for a request naming a version "
    "this gateway does not have",
    "route": f"how the request was routed: {_values(ROUTES)}",
    "code": "the gRPC status name the request ended with, for both APIs (`OK`, "
    "`INVALID_ARGUMENT`, `UNAVAILABLE`, …)",
    "api": f"the API the request came through: {_values(APIS)}",
    "outcome": f"feedback: {_values(FEEDBACK_OUTCOMES)}; prediction log: "
    f"{_values(PREDICTION_LOG_OUTCOMES)}",
    "from_version": "the version that failed",
    "to_version": "the version that answered instead",
    "stage": f"where the request was when its client hung up: {_values(DISCONNECT_STAGES)}",
    "state": f"the rollout's state: {_values(STATE_LABELS)}",
}


# prometheus_client's multiprocess modes: how /metrics of a pool combines its workers.
POOL_MODES = {
    "sum": "sum",  # counters and histograms
    "livesum": "sum of the live workers",
    "livemin": "lowest live worker",
    "livemax": "highest live worker",
    "all": "one series per worker (`pid` label)",
}


@dataclass(frozen=True)
class Exporter:
    """A process that serves metrics, and how it declares them on a registry."""

    title: str
    where: str
    declare: Callable[[], CollectorRegistry]
    pooled: bool  # runs as a pool of processes whose /metrics adds up the workers'


def _gateway() -> CollectorRegistry:
    metrics = GatewayMetrics()
    RoutingStore(registry=metrics.registry)  # the routing gauges the gateway adds
    return metrics.registry


EXPORTERS = (
    Exporter(
        "Gateway",
        "`slipway serve`: `GET /metrics` on the REST port. In a pool of processes "
        "(`--processes N`) any worker answers for all of them, combining its workers' values "
        "as the pool column says.",
        _gateway,
        pooled=True,
    ),
    Exporter(
        "Rollout controller",
        "`slipway canary start --metrics-port PORT`: `GET /metrics` on that port, while the "
        "controller runs.",
        lambda: ControllerMetrics().registry,
        pooled=False,
    ),
)


@dataclass(frozen=True)
class Metric:
    """One metric as a scrape shows it."""

    name: str  # the name declared, without the _total, _bucket, ... suffixes
    type: str
    labels: tuple[str, ...]
    help: str
    buckets: tuple[float, ...]  # a histogram's upper bounds, +Inf left out
    pool: str  # how a pool of gateway processes combines its workers' values

    @property
    def series(self) -> tuple[str, ...]:
        """The names its samples carry in the exposition."""
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
        return tuple(self.name + suffix for suffix in suffixes.get(self.type, ("",)))


def metrics(registry: CollectorRegistry) -> list[Metric]:
    """The metrics declared on ``registry``, in declaration order.

    prometheus_client reads a metric's label names, buckets and multiprocess mode back only
    from its attributes, and lists a registry's metrics only in its ``_collector_to_names``:
    a release that renamed them fails ``tests/docs/test_reference_metrics.py``.
    """
    found = []
    for collector in registry._collector_to_names:
        if not isinstance(collector, MetricWrapperBase):
            continue
        (family,) = collector.describe()
        bounds = tuple(getattr(collector, "_upper_bounds", ()))
        buckets = tuple(bound for bound in bounds if bound != float("inf"))
        pool = POOL_MODES[getattr(collector, "_multiprocess_mode", "sum")]
        labels = collector._labelnames
        found.append(Metric(family.name, family.type, labels, family.documentation, buckets, pool))
    return found


HEADER = """\
# Metrics reference

Every Prometheus metric a Slipway process exports, read from the code's declarations by

    python -m slipway.metrics_reference > docs/reference/metrics.md

and checked by a test, so it cannot drift from what `/metrics` serves. Training, the data
pipeline and the routing source export none. Counters and histograms of a single process
also carry prometheus_client's `_created` series (when the series started).
"""


def render() -> str:
    """The whole reference as Markdown: a table per exporter, histogram buckets, labels."""
    lines = [HEADER]
    histograms: dict[str, tuple[float, ...]] = {}
    for exporter in EXPORTERS:
        lines += [f"\n## {exporter.title}\n", exporter.where, ""]
        columns = ["metric", "type", "labels", "meaning"] + ["pool"] * exporter.pooled
        lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for metric in metrics(exporter.declare()):
            names = "<br>".join(f"`{name}`" for name in metric.series)
            labels = ", ".join(f"`{label}`" for label in metric.labels)
            cells = [names, metric.type, labels, cell(metric.help)] + [
                metric.pool
            ] * exporter.pooled
            lines.append("| " + " | ".join(cells) + " |")
            if metric.buckets:
                histograms[metric.name] = metric.buckets
    lines += ["\n## Histogram buckets\n", "Upper bounds of each histogram's `le` buckets:", ""]
    lines += ["| histogram | buckets |", "|---|---|"]
    for name, bounds in histograms.items():
        lines.append(f"| `{name}` | {', '.join(f'{bound:g}' for bound in bounds)} |")
    lines += ["\n## Labels\n", "| label | meaning |", "|---|---|"]
    lines += [f"| `{label}` | {cell(meaning)} |" for label, meaning in LABELS.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    print(render(), end="")


if __name__ == "__main__":
    main()
