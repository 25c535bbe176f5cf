"""Labels that arrive after the answer: live accuracy of each model version and route.

The gateway remembers, for every request it answered, what it served: the model, the
version and route, and per row the top-1 class (classification) or the value
(regression). A label sent later under the request id is compared with that and counted
in ``slipway_gateway_feedback_total{outcome=correct|incorrect}`` or
``slipway_gateway_feedback_absolute_error``, so a canary's accuracy can be compared with
stable's while both take traffic.

Memory is bounded: at most ``capacity`` answers, each kept ``ttl_s`` seconds; answers
are written once, so the oldest is the first to go (insertion order is age order). A
class answer keeps the index and name of the served class only, never the scores.

Feedback body (REST ``POST /v1/models/{m}/feedback``; the gRPC call takes the same
object plus ``"model"``), one item or ``{"feedback": [item, ...]}``; an item is one of::

    {"request_id": "…", "label": L}              # the request had one row
    {"request_id": "…", "labels": [L0, L1, …]}    # one per row; null skips a row
    {"request_id": "…", "row": 2, "label": L}     # one row of a batched request

A class label is the class index (integer) or its name; a regression label is a number.
A row is labelled once: a second label for it is ``ALREADY_EXISTS`` and counts nothing.
In a batch, a malformed item rejects the whole batch (nothing is counted), while an
unknown, expired or already labelled request id is reported in that item's result.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import grpc
import numpy as np

from serving.errors import FailedPrecondition, InvalidArgument, NotFound, ServingError
from serving.inference_results import top_classes, values_from_outputs
from serving.metrics import GatewayMetrics
from serving.request_id import check_request_id

BATCH_KEY = "feedback"
_ITEM_KEYS = frozenset({"request_id", "label", "labels", "row"})

Label = int | float | str


class Answered(NamedTuple):
    """What one request was served, per row, and which rows have a label already.

    The store keeps it as a plain tuple of plain values (``tuple(answer)``), which the
    garbage collector stops tracking after a look or two: a full store (``capacity``
    answers) of tracked objects would add hundreds of thousands of objects to every full
    collection, each a pause of the event loop. (It untracks exact tuples only, not
    this class's instances.) A label stores a new tuple in the answer's place.
    """

    model: str
    version: int
    route: str
    served_at: float
    classes: tuple[tuple[int, str], ...] | None = None  # per row: top-1 (index, name)
    class_count: int = 0
    values: tuple[float, ...] | None = None  # per row: the regression value
    labelled: int = 0  # bit r set: row r has a label

    @property
    def rows(self) -> int:
        return len(self.classes if self.classes is not None else self.values or ())


@dataclass(frozen=True)
class _Item:
    request_id: str
    labels: dict[int | None, Label]  # row (None: the only row) -> label


def served(
    model: str,
    version: int,
    route: str,
    outputs: Mapping[str, np.ndarray],
    manifest: Mapping[str, Any] | None,
    served_at: float,
) -> Answered:
    """What a label can be compared with: top-1 classes if an output holds class scores,
    else one value per row if one holds a regression, else neither."""
    try:
        class_count, classes = top_classes(outputs, manifest)
        return Answered(model, version, route, served_at, tuple(classes), class_count)
    except FailedPrecondition:
        pass
    values = None
    with contextlib.suppress(FailedPrecondition):
        values = tuple(values_from_outputs(outputs, manifest, None))
    return Answered(model, version, route, served_at, values=values)


def _whole_number(value: Any, where: str) -> int:
    """A non-negative integer, also when it arrives as a float (as Struct numbers do)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value != int(value)
        or value < 0
    ):
        raise InvalidArgument(f"{where}: expected a non-negative integer, got {value!r}")
    return int(value)


def _label(value: Any, where: str) -> Label:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidArgument(f"{where}: expected a class index, a class name or a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(f"{where}: expected a finite number, got {value!r}")
    return value


def _parse_item(item: Any, where: str) -> _Item:
    if not isinstance(item, Mapping):
        raise InvalidArgument(f"{where}: expected an object with request_id and label(s)")
    unknown = sorted(set(item) - _ITEM_KEYS)
    if unknown:
        raise InvalidArgument(f"{where}: unknown field {unknown[0]!r}")
    request_id = check_request_id(item.get("request_id"), f"{where}.request_id")
    if ("label" in item) == ("labels" in item):
        raise InvalidArgument(f"{where}: give either 'label' or 'labels' (one per row)")
    if "labels" in item:
        if "row" in item:
            raise InvalidArgument(f"{where}: 'row' goes with 'label', not with 'labels'")
        labels = item["labels"]
        if not isinstance(labels, list) or not labels:
            raise InvalidArgument(f"{where}.labels: expected a non-empty list, one per row")
        return _Item(
            request_id,
            {
                row: _label(value, f"{where}.labels[{row}]")
                for row, value in enumerate(labels)
                if value is not None
            },
        )
    row = None if "row" not in item else _whole_number(item["row"], f"{where}.row")
    return _Item(request_id, {row: _label(item["label"], f"{where}.label")})


def parse_feedback(body: Mapping[str, Any]) -> tuple[list[_Item], bool]:
    """The items of a feedback body and whether it was a batch; ``InvalidArgument`` if
    anything is malformed."""
    if BATCH_KEY not in body:
        return [_parse_item(body, "feedback")], False
    if set(body) != {BATCH_KEY}:
        raise InvalidArgument(f"a batch has only the {BATCH_KEY!r} field")
    items = body[BATCH_KEY]
    if not isinstance(items, list) or not items:
        raise InvalidArgument(f"{BATCH_KEY!r}: expected a non-empty list of feedback items")
    return [_parse_item(item, f"{BATCH_KEY}[{i}]") for i, item in enumerate(items)], True


class FeedbackStore:
    """Served answers by request id (bounded, time-limited) and the labels sent for them.

    Used from the gateway's event loop only, so it needs no lock.
    """

    def __init__(
        self,
        metrics: GatewayMetrics,
        *,
        capacity: int,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metrics = metrics
        self._capacity = capacity
        self._ttl_s = ttl_s
        self._clock = clock
        self._answers: OrderedDict[str, tuple[Any, ...]] = OrderedDict()  # see Answered

    def __len__(self) -> int:
        return len(self._answers)

    def remember(
        self,
        request_id: str,
        model: str,
        version: int,
        route: str,
        outputs: Mapping[str, np.ndarray],
        manifest: Mapping[str, Any] | None,
    ) -> None:
        """Keep what ``request_id`` was served (a reused id replaces the older answer)."""
        now = self._clock()
        self._answers.pop(request_id, None)
        self._answers[request_id] = tuple(served(model, version, route, outputs, manifest, now))
        while self._answers and (
            len(self._answers) > self._capacity
            or Answered._make(next(iter(self._answers.values()))).served_at <= now - self._ttl_s
        ):
            self._answers.popitem(last=False)

    def submit(self, model: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Count the labels in ``body`` for answers of ``model``; the answer to send back.

        A single item's failure is raised; a batch answers ``{"results": [...]}`` with
        each item's result or error (malformed input still fails the whole batch).
        """
        items, batch = parse_feedback(body)
        planned: list[_Item | ServingError] = []
        for item in items:
            try:
                self._check(model, item)  # every item before any is counted
                planned.append(item)
            except InvalidArgument:
                raise
            except ServingError as exc:
                if not batch:
                    raise
                planned.append(exc)
        results = []
        for plan in planned:
            try:
                if isinstance(plan, ServingError):
                    raise plan
                results.append(self._apply(plan))
            except ServingError as exc:
                if not batch:
                    raise
                results.append({"error": exc.message, "code": exc.code.name})
        return {"results": results} if batch else results[0]

    def _check(self, model: str, item: _Item) -> None:
        """That ``item`` labels a kept answer of ``model`` with labels that fit it."""
        kept = self._answers.get(item.request_id)
        answered = None if kept is None else Answered._make(kept)
        if answered is not None and answered.served_at <= self._clock() - self._ttl_s:
            answered = None
        if answered is None or answered.model != model:
            raise NotFound(
                f"request id {item.request_id!r} is unknown or expired for model {model!r} "
                f"(answers are kept {self._ttl_s:g} s, at most {self._capacity})"
            )
        if answered.classes is None and answered.values is None:
            raise FailedPrecondition(
                f"request {item.request_id!r} was answered with no class scores and no "
                "regression value to compare a label with"
            )
        rows = answered.rows
        if None in item.labels and rows != 1:
            raise InvalidArgument(
                f"request {item.request_id!r} answered {rows} rows: give 'labels' (one per "
                "row) or 'row' with 'label'"
            )
        if len(item.labels) > rows or any(row is not None and row >= rows for row in item.labels):
            raise InvalidArgument(f"request {item.request_id!r} answered {rows} row(s) only")
        for row, label in item.labels.items():
            where = f"request {item.request_id!r} row {row or 0}"
            if answered.classes is not None:
                if not isinstance(label, str) and (
                    label != int(label) or not 0 <= label < answered.class_count
                ):
                    raise InvalidArgument(
                        f"{where}: expected a class name or a class index in "
                        f"[0, {answered.class_count}), got {label!r}"
                    )
            elif isinstance(label, str):
                raise InvalidArgument(f"{where}: the answer is a regression; expected a number")

    def _apply(self, item: _Item) -> dict[str, Any]:
        # Read now: an earlier item of the same batch may have labelled rows of it.
        answered = Answered._make(self._answers[item.request_id])
        rows = {0 if row is None else row: label for row, label in item.labels.items()}
        again = sorted(row for row in rows if answered.labelled >> row & 1)
        if again:
            raise ServingError(
                grpc.StatusCode.ALREADY_EXISTS,
                f"request {item.request_id!r} row {again[0]} already has a label",
            )
        labelled = answered.labelled | sum(1 << row for row in rows)
        self._answers[item.request_id] = tuple(answered._replace(labelled=labelled))
        where = (answered.model, answered.version, answered.route)
        results = []
        for row, label in sorted(rows.items()):
            if answered.classes is not None:
                index, name = answered.classes[row]
                correct = label == name if isinstance(label, str) else int(label) == index
                self._metrics.observe_feedback(*where, correct=correct)
                results.append({"row": row, "outcome": "correct" if correct else "incorrect"})
            else:
                assert answered.values is not None
                error = abs(float(label) - answered.values[row])
                self._metrics.observe_absolute_error(*where, error)
                results.append({"row": row, "absolute_error": error})
        return {"request_id": item.request_id, "rows": results}
