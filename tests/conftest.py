"""Quiet TensorFlow, the plugins every test shares, and a closing word on skipped groups."""

from __future__ import annotations

import os

import pytest

from tests.support import prometheus

pytest_plugins = [
    "tests.support.tiers",
    "tests.support.isolation",
    "tests.support.fixtures",
    "tests.support.serving_fixtures",
]

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYTHONHASHSEED", "0")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name the group of tests a missing Prometheus skipped, and how to get it."""
    skipped = [
        report
        for report in terminalreporter.stats.get("skipped", [])
        if prometheus.MISSING in str(report.longrepr)
    ]
    if skipped:
        terminalreporter.write_line(
            f"{len(skipped)} tests that run a real Prometheus were skipped: "
            f"{prometheus.MISSING}. Install it with {prometheus.INSTALL_HINT}.",
            yellow=True,
            bold=True,
        )
