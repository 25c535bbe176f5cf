"""Distillation end to end: a small MLP student learns from a published teacher."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from compression.errors import CompressionError
from compression.evaluate import EvalSettings
from compression.pipeline import CompressOptions, MethodOptions, compress
from tests.support.compression_models import SourceModel

FAST = EvalSettings(latency_runs=20, warmup_runs=2, throughput_seconds=0.0)


def student_file(directory: Path) -> Path:
    path = directory / "student.yaml"
    config = {
        "name": "student",
        "data": {"dataset": "unused-the-teacher-s-dataset-is-used"},
        "model": {"type": "mlp", "hidden_units": [8]},
        "training": {"epochs": 4, "optimizer": {"learning_rate": 0.01}},
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def test_a_distilled_int8_student_is_a_row_of_the_report(
    mlp_source: SourceModel, tmp_path: Path
) -> None:
    options = CompressOptions(
        methods=["distill"],
        max_accuracy_drop=100.0,
        settings=FAST,
        method_options=MethodOptions(student=student_file(tmp_path), then="int8"),
    )
    run = compress(mlp_source.version_dir, mlp_source.dataset_dir, options, tmp_path / "report")
    report = json.loads(run.files.json.read_text())
    rows = {row["method"]: row for row in report["results"][1:]}
    assert set(rows) == {"float32", "distill+int8"}
    distilled = rows["distill+int8"]
    assert distilled["accuracy"] > 0.3  # ten digit classes: chance is 0.1
    details = distilled["details"]
    assert details["distill"]["student_parameters"] < details["distill"]["teacher_parameters"]
    assert details["int8"]["scheme"] in ("full", "16x8")  # no attention to keep float
    assert distilled["size_ratio"] < 1.0
    assert "| distill+int8 | TFLite |" in run.files.markdown.read_text()


def test_distill_without_a_student_is_refused_before_anything_runs() -> None:
    with pytest.raises(CompressionError, match="needs --student"):
        CompressOptions(methods=["distill"])
    with pytest.raises(CompressionError, match="--then applies to --method distill only"):
        CompressOptions(methods=["int8"], method_options=MethodOptions(then="int8"))


def test_a_student_file_without_a_model_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "student.yaml"
    path.write_text(
        yaml.safe_dump({"name": "s", "data": {"dataset": "d"}, "training": {"epochs": 1}})
    )
    with pytest.raises(CompressionError, match="names no model"):
        CompressOptions(methods=["distill"], method_options=MethodOptions(student=path))
