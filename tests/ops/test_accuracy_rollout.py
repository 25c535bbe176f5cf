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

import numpy as np
import pytest
import yaml

from ops.events import Event
from ops.state import Phase, StateStore
from slipway.demo_rollout import request_pool
from tests.support.rollouts import (
    EQUAL,
    LESS_ACCURATE,
    MODEL,
    STABLE,
    Fleet,
    Rollouts,
    events,
    replica_routing,
    rollout,
)
from tests.support.serving_models import ServingModel

pytestmark = [pytest.mark.process, pytest.mark.timeout(420)]

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


def labelled_pool(serving_model: ServingModel) -> tuple[list[dict], list[int]]:
    """Request rows and, as their true labels, the classes the stable model predicts."""
    rows = request_pool(serving_model.signature_json())
    inputs = {name: np.asarray([row[name] for row in rows]) for name in rows[0]}
    inputs["image"] = inputs["image"].astype(np.float32)
    scores = serving_model.keras_outputs(inputs)["label"]
    return rows, [int(index) for index in scores.argmax(axis=1)]


@pytest.fixture(scope="module")
def fleet(
    rollout_fleet: Fleet, serving_model: ServingModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Rollouts]:
    """The shared fleet under labelled client traffic whose labels come back as feedback."""
    analysis = tmp_path_factory.mktemp("accuracy-rollouts") / "analysis.yaml"
    analysis.write_text(yaml.safe_dump(ANALYSIS))
    pool, labels = labelled_pool(serving_model)
    with rollout_fleet.traffic(pool, labels=labels, feedback_delay=0.5) as load:
        yield Rollouts.on(rollout_fleet, load, analysis)


def accuracy_checks(store: StateStore) -> list[tuple[Event, dict]]:
    """Every analysis that judged accuracy (not skipped for want of labels), with that check."""
    return [
        (event, check)
        for event in events(store)
        if event.kind == "analysis"
        for check in event.checks
        if check["name"] == "accuracy" and not check["skipped"]
    ]


def test_a_less_accurate_canary_is_rolled_back_on_accuracy(
    fleet: Rollouts, store: StateStore
) -> None:
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
    fleet: Rollouts, store: StateStore
) -> None:
    output = rollout(fleet, store, EQUAL)
    state = store.load(MODEL)
    assert state.phase is Phase.SUCCEEDED, output
    judged = accuracy_checks(store)
    assert judged, "the accuracy check never had enough labels to judge:\n" + output
    # An analysis held for want of canary requests leaves every check undecided (None) even
    # when accuracy had its labels: every analysis that decided passed accuracy.
    decided = [check for event, check in judged if event.outcome != "inconclusive"]
    assert decided and all(check["passed"] is True for check in decided), output
    assert all(check["stable"] > 0.95 for _, check in judged)  # labels agree with stable
    assert fleet.load.counts().feedback.refused == 0
