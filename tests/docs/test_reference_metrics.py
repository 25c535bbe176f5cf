"""The metrics reference reads every metric back whole, from every module that declares one,
and explains every label."""

from __future__ import annotations

import ast
from pathlib import Path

from slipway import PACKAGES
from slipway.metrics_reference import EXPORTERS, LABELS, metrics

ROOT = Path(__file__).resolve().parents[2]
METRIC_TYPES = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}
# The modules that declare metrics, each read through one of the EXPORTERS.
DECLARING = {"serving/metrics.py", "serving/routing_store.py", "ops/controller.py"}


def all_metrics() -> list:
    return [metric for exporter in EXPORTERS for metric in metrics(exporter.declare())]


def declares_metrics(path: Path) -> bool:
    """Whether a module imports one of prometheus_client's metric types."""
    return any(
        isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith("prometheus_client")
        and bool(METRIC_TYPES & {alias.name for alias in node.names})
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
    )


def test_every_module_that_declares_metrics_is_read() -> None:
    found = {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if declares_metrics(path)
    }
    assert found == DECLARING, "add a new exporter to slipway.metrics_reference.EXPORTERS"


def test_metrics_are_read_back_with_labels_and_buckets() -> None:
    by_name = {metric.name: metric for metric in all_metrics()}
    requests = by_name["slipway_gateway_requests"]
    assert (requests.type, requests.labels) == (
        "counter",
        ("model", "version", "route", "code", "api"),
    )
    assert requests.series == ("slipway_gateway_requests_total",)
    latency = by_name["slipway_gateway_request_seconds"]
    assert latency.buckets[0] == 0.0004 and latency.buckets[-1] == 10.0
    assert by_name["slipway_gateway_in_flight"].pool == "sum of the live workers"
    assert "slipway_rollout_state" in by_name
    assert all(metric.help for metric in by_name.values())


def test_every_label_is_explained_and_every_explanation_used() -> None:
    used = {label for metric in all_metrics() for label in metric.labels}
    assert sorted(used - set(LABELS)) == [], "explain these labels in LABELS"
    assert sorted(set(LABELS) - used) == [], "LABELS explains labels no metric has"
