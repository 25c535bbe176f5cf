"""A canary that answers fast and without errors but less accurately is rolled back on
accuracy: two real gateway processes, a real Prometheus scraping them every second,
labelled client traffic whose true labels come back as feedback by request id, and the
controller run as ``slipway canary start``.

The tiny test model is untrained, so a row's true label here is the class stable itself
predicts for it: stable and its unchanged copy are right on every row, and the wrapper
that rotates the class scores of the ``SWAP_PERCENT`` % of rows whose inputs hash low is
wrong on those rows only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from ops.events import Event
from ops.state import Phase, StateStore
from serving.routing import ModelRouting
from slipway.demo_rollout import (
    publish_copy,
    publish_faulty_version,
    request_pool,
    write_gateway_config,
)
from tests.ops.test_rollout_integration import (
    Fleet,
    events,
    replica_routing,
    rollout,
    running_fleet,
)
from tests.serving import model_factory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

MODEL = model_factory.MODEL_NAME
STABLE, EQUAL, LESS_ACCURATE = 1, 2, 3
SWAP_PERCENT = 40
# Errors and accuracy are judged; latency is not, because on a loaded machine a freshly
# loaded canary's p99 can exceed stable's several times over (see the rollout tests).
# 20 labels at 10 % of 60 requests/s take under 4 s, so the accuracy check usually
# decides at the first step; if that step bakes first, it decides at the next one (at
# 100 % against stable's side of the step before), so the verdict never depends on when.
ANALYSIS = {
    "window": "5s",
    "min_requests": 20,
    "checks": {
        "latency_p99": None,
        "accuracy": {"max_decrease_points": 5.0, "min_labels": 20},
    },
}


def labelled_pool() -> tuple[list[dict], list[int]]:
    """Request rows and, as their true labels, the classes the stable model predicts."""
    rows = request_pool(model_factory.signature_json())
    inputs = {name: np.asarray([row[name] for row in rows]) for name in rows[0]}
    inputs["image"] = inputs["image"].astype(np.float32)
    scores = model_factory.keras_outputs(inputs)["label"]
    return rows, [int(index) for index in scores.argmax(axis=1)]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("accuracy-rollouts")
    root = work / "models"
    stable = model_factory.publish(root, STABLE)
    publish_copy(stable, root, MODEL, EQUAL)
    publish_faulty_version(stable, root, MODEL, LESS_ACCURATE, swap_percent=SWAP_PERCENT)
    config = write_gateway_config(work / "gateway", routing={MODEL: {"labels": {"stable": STABLE}}})
    analysis = work / "analysis.yaml"
    analysis.write_text(yaml.safe_dump(ANALYSIS))
    pool, labels = labelled_pool()
    with running_fleet(root, config, analysis, pool, labels=labels, feedback_delay=0.5) as fleet:
        yield fleet


@pytest.fixture
def store(fleet: Fleet, tmp_path: Path) -> StateStore:
    """A fresh state directory, and the model back on version 1 alone on every replica."""
    fleet.admin().set_routing(MODEL, ModelRouting(labels={"stable": STABLE}))
    return StateStore(tmp_path / "state")


def accuracy_checks(store: StateStore) -> list[tuple[Event, dict]]:
    """Every analysis that judged accuracy (not skipped for want of labels), with that check."""
    return [
        (event, check)
        for event in events(store)
        if event.kind == "analysis"
        for check in event.checks
        if check["name"] == "accuracy" and not check["skipped"]
    ]


def test_a_less_accurate_canary_is_rolled_back_on_accuracy(fleet: Fleet, store: StateStore) -> None:
    before = fleet.load.counts()
    output = rollout(fleet, store, LESS_ACCURATE)
    during = fleet.load.counts()
    state = store.load(MODEL)
    assert state.phase is Phase.ROLLED_BACK, output
    assert "accuracy" in state.reason, state.reason
    failed = [(event, check) for event, check in accuracy_checks(store) if check["passed"] is False]
    assert failed, output
    event, check = failed[-1]
    assert event.outcome == "fail"
    assert check["canary"] < check["limit"] < check["stable"]
    assert event.numbers["canary"]["errors"] == 0  # answered without errors: only less accurate
    assert event.numbers["canary"]["labelled"] >= ANALYSIS["checks"]["accuracy"]["min_labels"]
    assert during.errors == before.errors
    right = during.feedback.correct - before.feedback.correct
    wrong = during.feedback.incorrect - before.feedback.incorrect
    assert right > 0 and wrong > 0
    assert during.feedback.refused == 0
    routing = replica_routing(fleet)
    assert routing.labels == {"stable": STABLE} and routing.canary_weight == 0


def test_an_equally_accurate_canary_with_feedback_is_promoted(
    fleet: Fleet, store: StateStore
) -> None:
    output = rollout(fleet, store, EQUAL)
    state = store.load(MODEL)
    assert state.phase is Phase.SUCCEEDED, output
    judged = accuracy_checks(store)
    assert judged, "the accuracy check never had enough labels to judge:\n" + output
    assert all(check["passed"] is True for _, check in judged), output
    assert all(check["stable"] > 0.95 for _, check in judged)  # labels agree with stable
    assert fleet.load.counts().feedback.refused == 0
