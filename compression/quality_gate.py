"""What a compressed result may lose against the model it replaces, and still pass.

Two figures, one per kind of head: a classification head may lose at most
``max_accuracy_drop`` points of top-1 accuracy, and a regression head's mean absolute
error may grow by at most ``max_error_increase`` percent of the reference's. A model with
no head of a kind has nothing of that kind to lose; a regression model is not waved
through because it has no accuracy. A result whose figures are not finite (NaN outputs,
say) fails whatever the limits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compression.errors import CompressionError
from compression.evaluate import Evaluation
from compression.report import FAILED, PASSED
from contracts.metric_values import non_finite

_TOLERANCE = 1e-9


def accuracy_drops(reference: Evaluation, candidate: Evaluation) -> dict[str, float]:
    """Points of top-1 accuracy each classification head lost (negative: gained)."""
    return {
        head: 100.0 * (accuracy - candidate.accuracy.get(head, 0.0))
        for head, accuracy in reference.accuracy.items()
    }


def error_increases(reference: Evaluation, candidate: Evaluation) -> dict[str, float]:
    """Percent by which each regression head's mean absolute error grew (negative: fell);
    from an error of 0, any error at all is an infinite increase."""
    increases = {}
    for head, before in reference.mae.items():
        after = candidate.mae.get(head, math.inf)
        if before > 0:
            increases[head] = 100.0 * (after - before) / before
        else:
            increases[head] = 0.0 if after <= 0 else math.inf
    return increases


@dataclass(frozen=True)
class QualityGate:
    """The limits a result is judged by (points of accuracy, percent of MAE)."""

    max_accuracy_drop: float = 1.0
    max_error_increase: float = 2.0

    def __post_init__(self) -> None:
        if self.max_accuracy_drop < 0:
            raise CompressionError(
                f"--max-accuracy-drop must be >= 0 points, got {self.max_accuracy_drop:g}"
            )
        if self.max_error_increase < 0:
            raise CompressionError(
                f"--max-error-increase must be >= 0 percent, got {self.max_error_increase:g}"
            )

    def passes(self, accuracy_drop: float | None, error_increase: float | None) -> bool:
        """Whether the worst drop and the worst increase (None: no such head) are within."""
        return (accuracy_drop is None or accuracy_drop <= self.max_accuracy_drop + _TOLERANCE) and (
            error_increase is None or error_increase <= self.max_error_increase + _TOLERANCE
        )

    def judge(self, reference: Evaluation, candidate: Evaluation) -> tuple[str, float | None, str]:
        """(status, worst accuracy drop in points, note) of ``candidate``."""
        unmeasured = [
            f"{figure} of {head!r} is {non_finite(value)}"
            for figure, values in (("accuracy", candidate.accuracy), ("mae", candidate.mae))
            for head, value in values.items()
            if non_finite(value) is not None
        ]
        if unmeasured:
            return FAILED, None, f"{'; '.join(unmeasured)}, not a number to judge"
        drops, increases = (
            accuracy_drops(reference, candidate),
            error_increases(reference, candidate),
        )
        worst = max(drops.values()) if drops else None
        failures = []
        if worst is not None and worst > self.max_accuracy_drop + _TOLERANCE:
            head = max(drops, key=drops.__getitem__)
            where = f" on {head!r}" if len(drops) > 1 else ""
            failures.append(
                f"accuracy drops {worst:.2f} points{where} (max {self.max_accuracy_drop:g})"
            )
        for head, increase in increases.items():
            if increase > self.max_error_increase + _TOLERANCE:
                where = f" of {head!r}" if len(increases) > 1 else ""
                failures.append(
                    f"mean absolute error{where} grows {increase:.2f} % "
                    f"({reference.mae[head]:.4g} → {candidate.mae[head]:.4g}; "
                    f"max {self.max_error_increase:g} %)"
                )
        return (FAILED if failures else PASSED), worst, "; ".join(failures)
