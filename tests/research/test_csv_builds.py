"""A CSV with scikit-learn's column names, one bad cell, a missing marker and an id used
only for the split: built with ``slipway data build``, trained with ``slipway train``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from contracts.dataset_manifest import load_manifest
from research.data.records import canonical_bytes
from research.data.split import split_for_key
from tests.support.cli import slipway
from tests.support.raw_data import write_spec
from tests.support.shards import read_examples

SPLITS = {"train": 0.7, "validation": 0.15, "test": 0.15}
BAD_ROW, MISSING_ROW = 11, 20  # rows (0-based, after the header) with a bad / missing cell


@pytest.fixture(scope="module")
def iris(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scikit-learn's iris under its own column names, built into ``<dir>/dataset``."""
    from sklearn.datasets import load_iris

    directory = tmp_path_factory.mktemp("iris")
    data = load_iris()
    header = ["plant id", *data.feature_names, "species"]
    lines = [",".join(f'"{name}"' for name in header)]
    for row, (values, species) in enumerate(zip(data.data, data.target, strict=True)):
        cells = [f"{value:g}" for value in values]
        if row == BAD_ROW:
            cells[3] = "abc"
        if row == MISSING_ROW:
            cells[0] = "n/a"
        lines.append(",".join([f"p{row // 3}", *cells, str(species)]))
    (directory / "iris.csv").write_text("\n".join(lines) + "\n")
    spec = write_spec(
        directory / "iris.yaml",
        {
            "name": "iris",
            "sources": [{"type": "csv", "path": "iris.csv"}],
            "exclude": ["plant id"],
            "labels": ["species"],
            "dedup": {"exact": {"enabled": False}},
            "split": {"ratios": SPLITS, "key": "plant id", "seed": "iris"},
        },
    )
    assert slipway("data", "build", spec, "-o", directory / "dataset") == 0
    return directory


def test_features_get_safe_names_and_keep_their_columns(iris: Path) -> None:
    manifest = load_manifest(iris / "dataset")
    assert {name: feature.source_name for name, feature in manifest.features.items()} == {
        "sepal_length_cm": "sepal length (cm)",
        "sepal_width_cm": "sepal width (cm)",
        "petal_length_cm": "petal length (cm)",
        "petal_width_cm": "petal width (cm)",
        "species": None,
    }
    assert manifest.labels == ["species"]
    assert manifest.provenance["spec"]["labels"] == ["species"]  # the spec as written


def test_the_report_says_which_type_each_field_got_and_why(iris: Path) -> None:
    report = json.loads((iris / "dataset" / "report.json").read_text())
    assert report["schema"]["petal_width_cm"] == {
        "type": "numeric",
        "dtype": "float32",
        "column": "petal width (cm)",
        "why": "numeric float32: 149 of 150 sampled values are numbers; 1 unparseable cell "
        f"('abc' at iris.csv:{BAD_ROW + 2}) quarantined with its record",
    }
    assert report["schema"]["sepal_length_cm"]["why"] == (
        "numeric float32: all 149 sampled values are numbers; 1 of 150 sampled records lack it"
    )
    assert report["schema"]["species"]["type"] == "categorical"


def test_the_bad_cell_is_quarantined_and_the_missing_one_written_as_missing(iris: Path) -> None:
    quarantined = [
        json.loads(line)
        for line in (iris / "dataset" / "quarantine.jsonl").read_text().splitlines()
    ]
    assert [(entry["origin"], entry["stage"]) for entry in quarantined] == [
        (f"iris.csv:{BAD_ROW + 2}", "conform")
    ]
    assert quarantined[0]["reason"] == (
        "field 'petal width (cm)': expected numeric float32, got 'abc' (not a number)"
    )
    examples = [e for split in read_examples(iris / "dataset").values() for e in split]
    assert len(examples) == 149
    assert sum("sepal_length_cm" not in example for example in examples) == 1


def test_the_split_follows_the_id_column_that_is_not_a_feature(iris: Path) -> None:
    expected: Counter[str] = Counter()
    for row in range(150):
        if row != BAD_ROW:
            expected[split_for_key(canonical_bytes(f"p{row // 3}"), SPLITS, "iris")] += 1
    manifest = load_manifest(iris / "dataset")
    assert {name: split.num_records for name, split in manifest.splits.items()} == expected
    assert all("plant id" not in e for s in read_examples(iris / "dataset").values() for e in s)


def test_slipway_train_and_export_on_the_renamed_features(iris: Path) -> None:
    experiment = {
        "name": "iris-mlp",
        "seed": 1,
        "run_dir": str(iris / "run"),
        "data": {"dataset": str(iris / "dataset"), "batch_size": 16, "shuffle_buffer": 64},
        "model": {"type": "mlp", "hidden_units": [8], "dropout": 0.0},
        "training": {
            "steps": 4,
            "precision": "float32",
            "optimizer": {"learning_rate": 0.01, "clip_global_norm": None},
            "schedule": {"decay": "constant"},
        },
        "checkpoint": {"every_steps": 4, "keep": 1},
        "export": {"model_root": str(iris / "models")},
    }
    path = iris / "experiment.yaml"
    path.write_text(yaml.safe_dump(experiment))
    assert slipway("train", path, "--quiet") == 0
    model = json.loads((iris / "models" / "iris-mlp" / "1" / "slipway.json").read_text())
    assert sorted(model["signature"]["inputs"]) == [
        "petal_length_cm",
        "petal_width_cm",
        "sepal_length_cm",
        "sepal_width_cm",
    ]
    assert list(model["signature"]["outputs"]) == ["species", "species_classes"]


def test_a_quarantined_row_is_masked_in_its_text_cells_only(tmp_path: Path) -> None:
    lines = ["ratio,score,note,label"]
    lines += [f"0.{1000 + i},{i}.25,plain words {i},{'ab'[i % 2]}" for i in range(40)]
    lines.append("0.1684,twelve,write to ann@example.org or +44 20 7946 0958,a")
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    spec = write_spec(
        tmp_path / "t.yaml",
        {
            "name": "masked",
            "sources": [{"type": "csv", "path": "t.csv"}],
            "schema": {
                "ratio": {"type": "numeric"},
                "score": {"type": "numeric"},
                "note": {"type": "text"},
                "label": {"type": "categorical"},
            },  # fmt: skip
            "labels": ["label"],
            "clean": {"pii": {"enabled": True, "fields": ["note"]}},
            "split": {"ratios": {"train": 0.5, "test": 0.5}},
        },
    )
    assert slipway("data", "build", spec, "-o", tmp_path / "dataset") == 0
    (entry,) = [json.loads(line) for line in (tmp_path / "dataset" / "quarantine.jsonl").open()]
    assert "0.1684" in entry["raw"] and "twelve" in entry["raw"]
    assert "ann@example.org" not in entry["raw"] and "7946" not in entry["raw"]
    assert "[EMAIL]" in entry["raw"] and "[PHONE]" in entry["raw"]
