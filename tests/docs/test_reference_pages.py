"""Every page under docs/reference/ is what its generator prints from the code today.

A reference page is generated (a module with ``render()``, run as
``python -m MODULE > docs/reference/PAGE``) or is a mkdocstrings page whose ``:::``
targets must import (``test_reference_python_api.py``). A page of neither kind would be
typed by hand and drift unseen, so the list below must name every page there is.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"

# Page -> the module that generates it.
GENERATED = {
    "analysis-yaml.md": "ops.analysis_reference",
    "cli.md": "slipway.cli_reference",
    "data-spec.md": "research.data.spec_reference",
    "experiment.md": "research.experiments.reference",
    "gateway-yaml.md": "serving.config_reference",
    "metrics.md": "slipway.metrics_reference",
}
# Pages mkdocstrings fills from docstrings at build time.
API_PAGES = {"python-api.md"}


@pytest.mark.parametrize("page", sorted(GENERATED))
def test_the_committed_page_is_the_generated_one(page: str) -> None:
    module = GENERATED[page]
    expected = importlib.import_module(module).render()
    committed = (REFERENCE / page).read_text(encoding="utf-8")
    assert committed == expected, f"out of date: run python -m {module} > docs/reference/{page}"


def test_every_reference_page_is_generated_or_an_api_page() -> None:
    pages = {path.name for path in REFERENCE.glob("*.md")}
    assert pages == set(GENERATED) | API_PAGES, (
        "a page under docs/reference/ must come from a generator listed in GENERATED "
        "(or be a mkdocstrings page in API_PAGES)"
    )
