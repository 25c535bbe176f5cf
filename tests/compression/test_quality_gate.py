"""The quality gate: points of accuracy per classification head, percent of MAE per
regression head, and never a pass for figures that are not numbers."""

from __future__ import annotations

import numpy as np
import pytest

from compression.errors import CompressionError
from compression.evaluate import Evaluation
from compression.quality_gate import QualityGate, error_increases
from compression.report import FAILED, PASSED


def scored(
    accuracy: dict[str, float] | None = None, mae: dict[str, float] | None = None
) -> Evaluation:
    return Evaluation(
        examples=100, accuracy=accuracy or {}, mae=mae or {}, agreement=None, max_abs_diff=None,
        size_bytes=1, gzip_bytes=1, latency_p50_ms=1.0, latency_p99_ms=1.0, latency_mean_ms=1.0,
        throughput=1.0, outputs={"y": np.zeros(1)},
    )  # fmt: skip


def test_a_regression_head_fails_when_its_error_grows_beyond_the_limit() -> None:
    reference = scored(mae={"price": 10.0})

    status, drop, note = QualityGate(max_error_increase=2.0).judge(
        reference, scored(mae={"price": 10.3})
    )

    assert (status, drop) == (FAILED, None)
    assert note == "mean absolute error grows 3.00 % (10 → 10.3; max 2 %)"
    assert (
        QualityGate(max_error_increase=2.0).judge(reference, scored(mae={"price": 10.1}))[0]
        == PASSED
    )
    assert QualityGate().judge(reference, scored(mae={"price": 9.0}))[0] == PASSED  # better


def test_a_multi_task_result_is_judged_on_every_head_and_names_each_failure() -> None:
    reference = scored(accuracy={"kind": 0.9}, mae={"price": 10.0, "weight": 2.0})
    candidate = scored(accuracy={"kind": 0.87}, mae={"price": 10.0, "weight": 2.5})

    status, drop, note = QualityGate(max_accuracy_drop=1.0, max_error_increase=5.0).judge(
        reference, candidate
    )

    assert status == FAILED and drop == pytest.approx(3.0)
    assert note.startswith("accuracy drops 3.00 points (max 1); ")
    assert "mean absolute error of 'weight' grows 25.00 %" in note
    assert "'price'" not in note


def test_from_an_error_of_zero_any_error_fails() -> None:
    assert error_increases(scored(mae={"y": 0.0}), scored(mae={"y": 0.1})) == {"y": float("inf")}
    assert error_increases(scored(mae={"y": 0.0}), scored(mae={"y": 0.0})) == {"y": 0.0}
    assert QualityGate().judge(scored(mae={"y": 0.0}), scored(mae={"y": 0.1}))[0] == FAILED


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"max_accuracy_drop": -1.0}, "--max-accuracy-drop must be >= 0 points"),
        ({"max_error_increase": -0.5}, "--max-error-increase must be >= 0 percent"),
    ],
)
def test_negative_limits_are_refused(limits: dict[str, float], message: str) -> None:
    with pytest.raises(CompressionError, match=message):
        QualityGate(**limits)
