"""Experiment mistakes reported as one line naming the file, line and key, before
TensorFlow loads: exit 2, never a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPOSITORY = Path(__file__).resolve().parents[2]

EXPERIMENT = {
    "name": "mlp",
    "data": {"dataset": "dataset"},
    "model": {"type": "mlp"},
    "training": {"steps": 10, "optimizer": {"learning_rate": 0.01}},
}


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The output with the console's line wrapping undone."""
    return " ".join((result.stdout + result.stderr).split())


def slipway_without_tensorflow(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``slipway ARGS`` in a fresh interpreter that fails if TensorFlow was imported."""
    probe = (
        "import sys; from slipway.cli import main\n"
        f"code = main({list(args)!r})\n"
        "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n"
        "sys.exit(code)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPOSITORY,
        check=False,
    )


@pytest.mark.parametrize(
    ("key", "value", "wording"),
    [
        ("learning_rate", 1e39, "finite float32"),
        ("learning_rate", float("inf"), "finite float32"),
        ("epsilon", 1e-50, "is 0 in float32"),
        ("clip_global_norm", 5e38, "finite float32"),
    ],
)
def test_values_float32_cannot_hold_are_config_errors(tmp_path, key, value, wording):
    experiment = {**EXPERIMENT, "training": {"steps": 10, "optimizer": {key: value}}}
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(experiment, sort_keys=False))
    line = next(
        number
        for number, text in enumerate(path.read_text().splitlines(), start=1)
        if text.strip().startswith(f"{key}:")
    )
    result = slipway_without_tensorflow("train", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    output = one_line(result)
    assert f"experiment.yaml:{line}: training.optimizer.{key}" in output
    assert wording in output
    assert "Traceback" not in output


def test_a_missing_experiment_is_reported_without_loading_tensorflow(tmp_path):
    result = slipway_without_tensorflow("train", str(tmp_path / "nowhere.yaml"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "nowhere.yaml" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from tests.training.experiments import build_digits_dataset

    return build_digits_dataset(tmp_path_factory.mktemp("digits"))


def edited_dataset(dataset: Path, directory: Path, edit) -> Path:
    """A copy of ``dataset`` whose manifest ``edit`` changed in place."""
    copy = directory / "dataset"
    shutil.copytree(dataset, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def no_records(manifest):
    for split in manifest["splits"].values():
        split["num_records"] = 0
        for shard in split["shards"]:
            shard["num_records"] = 0


def no_classes(manifest):
    manifest["features"]["label"]["vocabulary"] = []


@pytest.mark.parametrize(
    ("edit", "experiment", "expected"),
    [
        (no_records, {}, "data.train_split: the dataset's split 'train' holds no records"),
        (no_classes, {}, "data.labels: label 'label' has 0 class(es)"),
        (
            None,
            {"heads": {"digit class": {"kind": "classification", "num_classes": 10}}},
            "heads.digit class: 'digit class' cannot name a model input or output",
        ),
    ],
    ids=["empty-dataset", "empty-label-vocabulary", "head-name"],
)
def test_datasets_and_names_a_model_cannot_have_are_config_errors(
    tmp_path, dataset, edit, experiment, expected
):
    data = dataset if edit is None else edited_dataset(dataset, tmp_path, edit)
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump({**EXPERIMENT, "data": {"dataset": str(data)}, **experiment}))
    result = slipway_without_tensorflow("train", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"experiment.yaml: {expected}" in one_line(result)
    assert "Traceback" not in result.stdout + result.stderr
