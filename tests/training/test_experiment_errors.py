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

from tests.support.cli import slipway

REPOSITORY = Path(__file__).resolve().parents[2]

EXPERIMENT = {
    "name": "mlp",
    "data": {"dataset": "dataset"},
    "model": {"type": "mlp"},
    "training": {"steps": 10, "optimizer": {"learning_rate": 0.01}},
}
# optimizer key, value, how the error words it
FLOAT32_CASES = [
    ("learning_rate", 1e39, "finite float32"),
    ("learning_rate", float("inf"), "finite float32"),
    ("epsilon", 1e-50, "is 0 in float32"),
    ("clip_global_norm", 5e38, "finite float32"),
]


def no_records(manifest):
    for split in manifest["splits"].values():
        split["num_records"] = 0
        for shard in split["shards"]:
            shard["num_records"] = 0


def no_classes(manifest):
    manifest["features"]["label"]["vocabulary"] = []


# manifest edit, experiment keys, the error
DATASET_CASES = [
    (no_records, {}, "data.train_split: the dataset's split 'train' holds no records"),
    (no_classes, {}, "data.labels: label 'label' has 0 class(es)"),
    (
        None,
        {"heads": {"digit class": {"kind": "classification", "num_classes": 10}}},
        "heads.digit class: 'digit class' cannot name a model input or output",
    ),
]
# A test process has TensorFlow loaded already: TensorFlow's absence is checked in a
# fresh interpreter running every case, each command's exit code recorded.
PROBE = """
import json, sys
from slipway.cli import main
report = []
for args in json.loads(sys.argv[1]):
    code = main(args)
    report.append({"args": args, "code": code, "tensorflow": "tensorflow" in sys.modules})
with open(sys.argv[2], "w") as out:
    json.dump(report, out)
"""


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    """``slipway ARGS`` in this process: the exit code, and its output with the console's
    line wrapping undone."""
    code = slipway(*args)
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).split())


def float32_experiment(directory: Path, key: str, value: float) -> tuple[Path, int]:
    """An experiment whose optimizer ``key`` is ``value``, and the line it is on."""
    experiment = {**EXPERIMENT, "training": {"steps": 10, "optimizer": {key: value}}}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "experiment.yaml"
    path.write_text(yaml.safe_dump(experiment, sort_keys=False))
    line = next(
        number
        for number, text in enumerate(path.read_text().splitlines(), start=1)
        if text.strip().startswith(f"{key}:")
    )
    return path, line


def edited_dataset(dataset: Path, directory: Path, edit) -> Path:
    """A copy of ``dataset`` whose manifest ``edit`` changed in place."""
    copy = directory / "dataset"
    shutil.copytree(dataset, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def dataset_experiment(directory: Path, dataset: Path, edit, experiment: dict) -> Path:
    """An experiment with ``experiment``'s keys on ``dataset`` (a copy ``edit`` changed)."""
    directory.mkdir(parents=True, exist_ok=True)
    data = dataset if edit is None else edited_dataset(dataset, directory, edit)
    path = directory / "experiment.yaml"
    path.write_text(yaml.safe_dump({**EXPERIMENT, "data": {"dataset": str(data)}, **experiment}))
    return path


@pytest.mark.parametrize(("key", "value", "wording"), FLOAT32_CASES)
def test_values_float32_cannot_hold_are_config_errors(tmp_path, capsys, key, value, wording):
    path, line = float32_experiment(tmp_path, key, value)
    code, output = run(capsys, "train", path)
    assert code == 2, output
    assert f"experiment.yaml:{line}: training.optimizer.{key}" in output
    assert wording in output
    assert "Traceback" not in output


def test_a_missing_experiment_is_reported(tmp_path, capsys):
    code, output = run(capsys, "train", tmp_path / "nowhere.yaml")
    assert code == 2, output
    assert "nowhere.yaml" in output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    ("edit", "experiment", "expected"),
    DATASET_CASES,
    ids=["empty-dataset", "empty-label-vocabulary", "head-name"],
)
def test_datasets_and_names_a_model_cannot_have_are_config_errors(
    tmp_path, capsys, digits_dataset, edit, experiment, expected
):
    path = dataset_experiment(tmp_path, digits_dataset, edit, experiment)
    code, output = run(capsys, "train", path)
    assert code == 2, output
    assert f"experiment.yaml: {expected}" in output
    assert "Traceback" not in output


@pytest.mark.process
def test_every_mistake_is_reported_without_loading_tensorflow(tmp_path, digits_dataset):
    experiments = [
        float32_experiment(tmp_path / f"float32-{index}", key, value)[0]
        for index, (key, value, _) in enumerate(FLOAT32_CASES)
    ]
    experiments.append(tmp_path / "nowhere.yaml")
    experiments += [
        dataset_experiment(tmp_path / f"dataset-{index}", digits_dataset, edit, experiment)
        for index, (edit, experiment, _) in enumerate(DATASET_CASES)
    ]
    commands = [["train", str(path)] for path in experiments]
    report_file = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(commands), str(report_file)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPOSITORY,
        check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    report = json.loads(report_file.read_text())
    assert [entry["code"] for entry in report] == [2] * len(commands), report
    loaded = [entry["args"] for entry in report if entry["tensorflow"]]
    assert not loaded, f"TensorFlow was imported by slipway {' '.join(loaded[0])}"
    assert "Traceback" not in result.stdout + result.stderr
