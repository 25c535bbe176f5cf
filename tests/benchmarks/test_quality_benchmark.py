"""The parts of ``benchmarks/quality.py`` that decide its figures, without any training:
the raw data writers (deterministic, complete, nothing downloaded), the dataset read back
for the baseline (exactly the built split), the baselines and the verdict."""

from __future__ import annotations

import json
import socket
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from benchmarks import quality
from slipway import raw_data


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a network connection fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.usefixtures("offline")
def test_docstrings_are_deterministic_long_enough_and_labelled_by_package(tmp_path: Path) -> None:
    records = raw_data.stdlib_docstrings()
    per_package = Counter(record["package"] for record in records)
    assert set(per_package) == set(raw_data.DOCSTRING_PACKAGES)
    assert all(
        100 <= count <= raw_data.MAX_DOCSTRINGS_PER_PACKAGE for count in per_package.values()
    )
    assert min(len(record["text"]) for record in records) >= raw_data.MIN_DOCSTRING_CHARS
    # The file is read from the sources again: equal records are a deterministic reading.
    written = raw_data.write_docstrings_jsonl(tmp_path).read_text(encoding="utf-8")
    assert [json.loads(line) for line in written.splitlines()] == records
    assert written.endswith("\n")


@pytest.mark.usefixtures("offline")
def test_scikit_learn_tables_and_digits_come_from_the_installed_wheel(tmp_path: Path) -> None:
    lines = raw_data.copy_sklearn_csv("breast_cancer.csv", tmp_path).read_text().splitlines()
    assert lines[0] == "569,30,malignant,benign" and len(lines) == 1 + 569
    lines = raw_data.copy_sklearn_csv("wine_data.csv", tmp_path).read_text().splitlines()
    assert lines[0] == "178,13,class_0,class_1,class_2" and len(lines) == 1 + 178
    with np.load(raw_data.write_digits_npz(tmp_path)) as digits:
        assert digits["images"].shape == (1797, 8, 8) and digits["images"].dtype == np.uint8
        assert digits["images"].max() == 255
        assert sorted(set(digits["target"].tolist())) == list(range(10))


def test_the_baseline_reads_back_exactly_the_built_split(tmp_path: Path) -> None:
    from sklearn.datasets import load_wine

    from contracts.dataset_manifest import load_manifest

    wine = next(task for task in quality.TASKS if task.name == "wine")
    quality.prepare(tmp_path, [wine])
    dataset = tmp_path / "datasets" / "wine"
    manifest = load_manifest(dataset)
    splits = {name: quality.read_split(dataset, name) for name in manifest.splits}
    for name, split in splits.items():
        assert len(split.labels) == split.inputs.shape[0] == manifest.splits[name].num_records
    assert sum(len(split.labels) for split in splits.values()) == 178
    table = load_wine()
    rows = {
        tuple(np.round(row, 3)): str(label)
        for row, label in zip(table.data, table.target, strict=True)
    }
    for row, label in zip(splits["test"].inputs, splits["test"].labels, strict=True):
        assert rows[tuple(np.round(row, 3))] == label
    train = {tuple(row) for row in splits["train"].inputs}
    assert not train & {tuple(row) for row in splits["test"].inputs}


def test_baselines_fit_on_train_and_score_on_test() -> None:
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [1000.0, 5.0]])  # scales a baseline must standardize

    def numbers(count: int) -> quality.Split:
        labels = rng.integers(0, 2, count)
        return quality.Split(
            centres[labels] + rng.normal(0, 1, (count, 2)), labels.astype(str).tolist()
        )

    assert quality.baseline_accuracy("logistic_regression", numbers(60), numbers(20)) == 1.0
    topics = {"net": "socket connection request server", "gui": "window button widget canvas"}

    def texts(count: int) -> quality.Split:
        labels = [("net", "gui")[index % 2] for index in range(count)]
        return quality.Split(
            [f"the {topics[label]} {index}" for index, label in enumerate(labels)], labels
        )

    assert quality.baseline_accuracy("tfidf_linear_svm", texts(20), texts(6)) == 1.0


@pytest.mark.parametrize(
    ("model", "baseline", "difference", "outcome"),
    [
        (0.95, 0.94, 1.0, "met"),
        (0.95, 0.955, -0.5, "met"),
        (0.945, 0.955, -1.0, "met"),
        (0.86, 0.96, -10.0, "missed"),
    ],
)
def test_the_verdict_allows_one_point_behind_the_baseline(
    model: float, baseline: float, difference: float, outcome: str
) -> None:
    assert quality.verdict(model, baseline)["difference_points"] == pytest.approx(difference)
    assert quality.verdict(model, baseline)["verdict"] == outcome


@pytest.mark.usefixtures("offline")
def test_the_diabetes_table_is_written_in_its_original_units(tmp_path: Path) -> None:
    lines = raw_data.write_diabetes_csv(tmp_path).read_text(encoding="utf-8").splitlines()
    assert lines[0] == "age,sex,bmi,bp,s1,s2,s3,s4,s5,s6,progression"
    assert len(lines) == 1 + 442
    ages = [float(line.split(",")[0]) for line in lines[1:]]
    assert min(ages) >= 18 and max(ages) <= 80  # years, not scikit-learn's scaled values
    assert raw_data.write_diabetes_csv(tmp_path).read_text(encoding="utf-8").splitlines() == lines


def test_the_ridge_baseline_scores_mae_and_r2_on_the_test_split() -> None:
    rng = np.random.default_rng(0)

    def rows(count: int) -> quality.Split:
        inputs = rng.normal(0, 1, (count, 3)) * [1.0, 100.0, 0.01]
        labels = inputs @ [2.0, 0.03, 300.0] + 150.0 + rng.normal(0, 0.1, count)
        return quality.Split(inputs, labels.tolist())

    scores = quality.baseline_regression(rows(200), rows(50))
    assert scores["mae"] < 0.2 and scores["r2"] > 0.99


@pytest.mark.parametrize(
    ("model", "outcome"),
    [
        ({"mae": 44.4, "r2": 0.506}, "met"),  # better than the baseline on both
        ({"mae": 46.9, "r2": 0.48}, "met"),  # 4.9 % and 3.6 % worse
        ({"mae": 47.2, "r2": 0.50}, "missed"),  # MAE 5.6 % worse
        ({"mae": 44.0, "r2": 0.47}, "missed"),  # R² 6 % worse
    ],
)
def test_the_regression_verdict_allows_five_percent_on_mae_and_r2(
    model: dict[str, float], outcome: str
) -> None:
    baseline = {"mae": 44.7, "r2": 0.50}
    assert quality.regression_verdict(model, baseline)["verdict"] == outcome
