"""Session-wide fixtures for data, training and compression tests: shared built artefacts.

Each is built by the first test that asks for it and shared, read-only, by every later test
of the run and every pytest-xdist worker. A test that changes one works on
``tests.support.artefacts.private_copy``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.compression_models import SourceModel, published_source
from tests.support.datasets import shared_corpus, shared_digits


@pytest.fixture(scope="session")
def digits_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scikit-learn's digits as 64-value vectors, three splits, built with Beam."""
    return shared_digits(tmp_path_factory)


@pytest.fixture(scope="session")
def corpus_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated corpus (400 documents) with a 256-piece vocabulary every mesh divides."""
    return shared_corpus(tmp_path_factory)


@pytest.fixture(scope="session")
def mlp_source(tmp_path_factory: pytest.TempPathFactory) -> SourceModel:
    """An MLP trained on the digits vectors and published as training publishes it."""
    return published_source(tmp_path_factory, "mlp")
