"""Non-finite metrics reach files as ``null`` with what they were, and come back."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from contracts.metric_values import NON_FINITE, from_json_metrics, json_metrics, shown
from contracts.model_manifest import read_model_manifest, write_model_manifest

METRICS = {
    "validation": {"loss": 2792.5, "target_mae": 41.5, "examples": 44.0},
    "test": {"loss": float("inf"), "target_mae": float("nan"), "examples": 83.0},
}


def test_non_finite_metrics_are_null_and_named() -> None:
    written = json_metrics(METRICS)
    assert written["test"] == {"loss": None, "target_mae": None, "examples": 83.0}
    assert written["validation"] == METRICS["validation"]
    assert written[NON_FINITE] == {"test.loss": "inf", "test.target_mae": "nan"}
    json.dumps(written, allow_nan=False)  # what strict JSON holds
    read = json.loads(json.dumps(written))
    restored = from_json_metrics(read)
    assert read["test"]["loss"] is None  # what was read is left as it was
    assert restored["test"]["loss"] == math.inf and math.isnan(restored["test"]["target_mae"])
    assert restored["validation"] == METRICS["validation"]
    assert json_metrics(restored) == written


def test_a_model_manifest_with_an_infinite_metric_is_written_not_refused(tmp_path: Path) -> None:
    write_model_manifest(tmp_path, {"name": "m", "signature": {}, "metrics": METRICS})
    manifest = read_model_manifest(tmp_path)
    assert manifest is not None
    assert manifest["metrics"]["test"]["loss"] is None
    assert manifest["metrics"][NON_FINITE]["test.loss"] == "inf"


@pytest.mark.parametrize(
    ("value", "text"),
    [(41.5432, "41.54"), (float("inf"), "inf (not finite)"), (float("-inf"), "-inf (not finite)"),
     (float("nan"), "nan (not finite)")],
)  # fmt: skip
def test_a_person_sees_what_a_metric_is(value: float, text: str) -> None:
    assert shown(value) == text
