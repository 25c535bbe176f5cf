"""Every ``::: dotted.path`` of the Python API page names something mkdocstrings finds, so
a renamed or moved function fails here rather than as a broken page on the site.

The lookup is mkdocstrings' own (griffe, reading the source with ``paths: [.]`` as
mkdocs.yml sets), so no module is imported and TensorFlow is not loaded.
"""

from __future__ import annotations

import re
from pathlib import Path

import griffe
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "python-api.md"
TARGET = re.compile(r"^::: ([\w.]+)\s*$", re.MULTILINE)


def targets() -> list[str]:
    return TARGET.findall(PAGE.read_text(encoding="utf-8"))


def test_the_page_documents_the_entry_points() -> None:
    names = {target.rsplit(".", 1)[1] for target in targets()}
    assert {"ExperimentTask", "train", "conform_model", "publish_model"} <= names


@pytest.mark.parametrize("target", targets())
def test_every_target_is_found_in_the_source(target: str) -> None:
    module, _, name = target.rpartition(".")
    loaded = griffe.GriffeLoader(search_paths=[str(ROOT)]).load(module)
    assert name in loaded.members, f"{module} has no {name}"
    assert loaded[name].docstring is not None, f"{target} has no docstring to show"
