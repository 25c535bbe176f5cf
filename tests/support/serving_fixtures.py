"""Session-wide fixtures for serving and ops tests: shared models and servers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.support.artefacts import shared_artefact

if TYPE_CHECKING:
    from tests.support.serving_models import ServingModel


@pytest.fixture(scope="session")
def serving_model(tmp_path_factory: pytest.TempPathFactory) -> ServingModel:
    """The digits test model, exported and converted once per run (TensorFlow is imported
    only by the tests that ask for it)."""
    from tests.support import serving_models

    directory = shared_artefact(tmp_path_factory, "serving-model", serving_models.build)
    return serving_models.ServingModel(directory)
