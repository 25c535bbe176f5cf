"""The analysis.yaml reference shows durations and defaults as a file author writes them,
and every default query in full."""

from __future__ import annotations

from ops.analysis import AnalysisConfig, Queries
from ops.analysis_reference import analysis_keys, render


def test_durations_are_shown_as_durations() -> None:
    window = next(key for key in analysis_keys() if key.path == "window")
    assert (window.type, window.default) == ("duration", "`30s`")


def test_every_default_query_is_shown_whole() -> None:
    page = render()
    for name, template in Queries().model_dump().items():
        assert f"`queries.{name}`:\n\n```text\n{template}\n```" in page


def test_every_check_is_listed() -> None:
    paths = {key.path for key in analysis_keys()}
    checks = AnalysisConfig.model_fields["checks"].annotation.model_fields
    assert {f"checks.{name}" for name in checks} <= paths
    assert "checks.custom[].query" in paths
