"""The rollout fleet the canary rollout modules share, and their per-test state directory.

Imported lazily: most ops tests need neither TensorFlow nor a gateway.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ops.state import StateStore

if TYPE_CHECKING:
    from tests.support.rollouts import Fleet, Rollouts
    from tests.support.serving_models import ServingModel


@pytest.fixture(scope="session")
def rollout_fleet(
    tmp_path_factory: pytest.TempPathFactory, serving_model: ServingModel
) -> Iterator[Fleet]:
    """Two gateway replicas and Prometheus, started once for every rollout test."""
    from tests.support.rollouts import running_fleet

    with running_fleet(tmp_path_factory.mktemp("rollout-fleet"), serving_model) as fleet:
        yield fleet


@pytest.fixture
def store(fleet: Rollouts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StateStore:
    """A fresh state directory, the model back on stable alone on every replica, and the
    admin token where a controller run in this process reads it.

    For the rollout modules, whose ``fleet`` fixture is the shared fleet with their traffic.
    """
    from slipway.demo_rollout import TOKEN_ENV
    from tests.support.rollouts import TOKEN, reset

    reset(fleet)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    return StateStore(tmp_path / "state")
