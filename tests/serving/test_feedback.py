"""Feedback: labels for answered requests, compared with what was served, counted once."""

from __future__ import annotations

import gc

import grpc
import numpy as np
import pytest

from serving.errors import InvalidArgument, NotFound, ServingError
from serving.feedback import FeedbackStore
from serving.metrics import GatewayMetrics

CLASSES = {"labels": {"label": {"kind": "classification", "classes": ["cat", "dog", "eel"]}}}
# Row 0 serves "dog" (1), row 1 "cat" (0), row 2 "eel" (2).
SCORES = np.array([[0.1, 0.8, 0.1], [0.7, 0.2, 0.1], [0.1, 0.1, 0.8]], np.float32)


@pytest.fixture
def metrics() -> GatewayMetrics:
    return GatewayMetrics()


@pytest.fixture
def now() -> list[float]:
    """The store's clock, moved by tests: ``now[0] += seconds``."""
    return [1000.0]


@pytest.fixture
def store(metrics: GatewayMetrics, now: list[float]) -> FeedbackStore:
    return FeedbackStore(metrics, capacity=3, ttl_s=60, clock=lambda: now[0])


def count(
    metrics: GatewayMetrics, outcome: str, version: str = "2", route: str = "canary"
) -> float:
    labels = {"model": "digits", "version": version, "route": route, "outcome": outcome}
    return metrics.registry.get_sample_value("slipway_gateway_feedback_total", labels) or 0.0


def remember(store: FeedbackStore, request_id: str, scores: np.ndarray = SCORES) -> None:
    outputs = {"label": scores, "value": np.zeros((len(scores), 1), np.float32)}
    store.remember(request_id, "digits", 2, "canary", outputs, CLASSES)


def test_one_row_by_index_and_by_name(store: FeedbackStore, metrics: GatewayMetrics) -> None:
    remember(store, "a", SCORES[:1])
    remember(store, "b", SCORES[1:2])
    answer = store.submit("digits", {"request_id": "a", "label": 1})
    assert answer == {"request_id": "a", "rows": [{"row": 0, "outcome": "correct"}]}
    answer = store.submit("digits", {"request_id": "b", "label": "dog"})
    assert answer["rows"] == [{"row": 0, "outcome": "incorrect"}]
    assert count(metrics, "correct") == 1
    assert count(metrics, "incorrect") == 1


def test_a_label_given_twice_counts_once(store: FeedbackStore, metrics: GatewayMetrics) -> None:
    remember(store, "a", SCORES[:1])
    store.submit("digits", {"request_id": "a", "label": 1})
    with pytest.raises(ServingError) as again:
        store.submit("digits", {"request_id": "a", "label": 0})
    assert again.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert again.value.http_status == 409
    assert count(metrics, "correct") == 1
    assert count(metrics, "incorrect") == 0


def test_rows_of_a_batched_request(store: FeedbackStore, metrics: GatewayMetrics) -> None:
    remember(store, "a")
    with pytest.raises(InvalidArgument, match="answered 3 rows: give 'labels'"):
        store.submit("digits", {"request_id": "a", "label": 1})
    answer = store.submit("digits", {"request_id": "a", "labels": [1, None, "cat"]})
    assert answer["rows"] == [{"row": 0, "outcome": "correct"}, {"row": 2, "outcome": "incorrect"}]
    # Labels from a Struct arrive as floats: 2.0 is class 2.
    answer = store.submit("digits", {"request_id": "a", "row": 1.0, "label": 0.0})
    assert answer["rows"] == [{"row": 1, "outcome": "correct"}]
    assert (count(metrics, "correct"), count(metrics, "incorrect")) == (2, 1)
    with pytest.raises(InvalidArgument, match="answered 3 row"):
        store.submit("digits", {"request_id": "a", "row": 3, "label": 0})


def test_unknown_expired_evicted_and_other_models_ids_are_not_found(
    store: FeedbackStore, now: list[float]
) -> None:
    with pytest.raises(NotFound, match="'nope' is unknown or expired"):
        store.submit("digits", {"request_id": "nope", "label": 1})
    remember(store, "old", SCORES[:1])
    with pytest.raises(NotFound):
        store.submit("other", {"request_id": "old", "label": 1})
    now[0] += 61
    with pytest.raises(NotFound):
        store.submit("digits", {"request_id": "old", "label": 1})
    for name in ("a", "b", "c", "d"):  # capacity 3: "a" goes first
        remember(store, name, SCORES[:1])
    assert len(store) == 3
    with pytest.raises(NotFound):
        store.submit("digits", {"request_id": "a", "label": 1})
    store.submit("digits", {"request_id": "d", "label": 1})


def test_regression_answers_record_the_absolute_error(
    store: FeedbackStore, metrics: GatewayMetrics
) -> None:
    store.remember("r", "house", 1, "stable", {"price": np.array([[2.0], [3.0]])}, None)
    answer = store.submit("house", {"request_id": "r", "labels": [2.5, 1.0]})
    assert answer["rows"] == [{"row": 0, "absolute_error": 0.5}, {"row": 1, "absolute_error": 2.0}]
    labels = {"model": "house", "version": "1", "route": "stable"}
    registry = metrics.registry
    assert registry.get_sample_value("slipway_gateway_feedback_absolute_error_sum", labels) == 2.5
    assert registry.get_sample_value("slipway_gateway_feedback_absolute_error_count", labels) == 2
    with pytest.raises(InvalidArgument, match="regression; expected a number"):
        store.remember("s", "house", 1, "stable", {"price": np.array([2.0])}, None)
        store.submit("house", {"request_id": "s", "label": "cheap"})


def test_a_batch_reports_each_item_and_malformed_input_counts_nothing(
    store: FeedbackStore, metrics: GatewayMetrics
) -> None:
    remember(store, "a", SCORES[:1])
    remember(store, "b", SCORES[:1])
    answer = store.submit(
        "digits",
        {"feedback": [{"request_id": "a", "label": 1}, {"request_id": "x", "label": 1},
                      {"request_id": "a", "label": 1}]},
    )  # fmt: skip
    results = answer["results"]
    assert results[0] == {"request_id": "a", "rows": [{"row": 0, "outcome": "correct"}]}
    assert results[1]["code"] == "NOT_FOUND"
    assert results[2]["code"] == "ALREADY_EXISTS"
    with pytest.raises(InvalidArgument, match=r"feedback\[1\].label"):
        store.submit(
            "digits", {"feedback": [{"request_id": "b", "label": 1}, {"request_id": "b",
                                                                      "label": True}]}
        )  # fmt: skip
    assert count(metrics, "correct") == 1
    store.submit("digits", {"request_id": "b", "label": 1})  # b was not counted before
    assert count(metrics, "correct") == 2


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"label": 1}, "request_id: expected 1 to 128 visible ASCII"),
        ({"request_id": "a b", "label": 1}, "request_id: expected"),
        ({"request_id": "a", "label": 1, "lable": 2}, "unknown field 'lable'"),
        ({"request_id": "a"}, "give either 'label' or 'labels'"),
        ({"request_id": "a", "label": 1, "labels": [1]}, "give either"),
        ({"request_id": "a", "labels": []}, "non-empty list"),
        ({"request_id": "a", "labels": [1], "row": 0}, "'row' goes with 'label'"),
        ({"request_id": "a", "row": -1, "label": 1}, "row: expected a non-negative integer"),
        ({"request_id": "a", "row": float("nan"), "label": 1}, "row: expected a non-negative"),
        ({"request_id": "a", "label": [1]}, "expected a class index, a class name or a number"),
        ({"request_id": "a", "label": 3}, r"class index in \[0, 3\), got 3"),
        ({"request_id": "a", "label": 1.5}, "class index"),
        ({"feedback": []}, "non-empty list"),
        ({"feedback": [{"request_id": "a", "label": 1}], "x": 1}, "only the 'feedback' field"),
    ],
)
def test_malformed_feedback_is_invalid_argument(
    store: FeedbackStore, body: dict, message: str
) -> None:
    remember(store, "a", SCORES[:1])
    with pytest.raises(InvalidArgument, match=message):
        store.submit("digits", body)


def test_an_answer_with_nothing_to_compare_is_failed_precondition(store: FeedbackStore) -> None:
    store.remember("t", "text", 1, "stable", {"echo": np.array([b"a", b"b"])}, None)
    with pytest.raises(ServingError) as refused:
        store.submit("text", {"request_id": "t", "labels": ["a", "b"]})
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_kept_answers_leave_the_garbage_collectors_scans(
    store: FeedbackStore, metrics: GatewayMetrics
) -> None:
    """A full store must not lengthen every full collection (a pause of the event loop)."""
    remember(store, "classes")
    store.remember(
        "values", "digits", 2, "canary", {"value": np.array([[1.5], [2.5]], np.float32)}, None
    )
    store.submit("digits", {"request_id": "classes", "row": 1, "label": 0})
    for _ in range(3):  # a collection untracks a tuple once the tuples in it are
        gc.collect()
    kept = list(store._answers.values())
    assert len(kept) == 2
    assert not any(gc.is_tracked(answer) for answer in kept)
    # A labelled row stays labelled in the answer that replaced the old one.
    with pytest.raises(ServingError):
        store.submit("digits", {"request_id": "classes", "row": 1, "label": 0})
