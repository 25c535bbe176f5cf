"""Fixtures the serving tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.repository import ModelRepository


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An empty model root (a test module may define its own ``root`` instead)."""
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def repositories() -> Iterator[list[ModelRepository]]:
    """Repositories made by a test, stopped (all versions unloaded) afterwards."""
    made: list[ModelRepository] = []
    yield made
    for repository in made:
        repository.stop()
