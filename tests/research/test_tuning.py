"""Hyper-parameter search: space files, their checks, and real searches on a tiny dataset."""

from __future__ import annotations

import argparse
import io
import json
import math
from pathlib import Path

import h5py
import keras_tuner
import numpy as np
import pytest
import yaml
from rich.console import Console

from research.configs import ConfigError
from research.data.manifest import load_manifest
from research.data.pipeline import build_dataset
from research.data.spec import load_spec
from research.experiments import load_experiment
from research.models import HeadSpec
from research.tuning import cli
from research.tuning.search import (
    PROJECT_NAME,
    best_experiment,
    head_named,
    metric_names,
    plan_search,
    run_search,
)
from research.tuning.space import load_space, set_path

EXPERIMENT = """\
name: tiny-cnn
seed: 3
data: {dataset: data/tiny, batch_size: 16}
model: {type: cnn, stem_filters: 4, stages: [4], dropout: 0.1}
training:
  epochs: 3
  optimizer: {learning_rate: 0.003}
export: {model_root: models}
"""

MLP = "{type: mlp, hidden_units: [16]}"

SPACE = """\
tuner: {type: random, max_trials: 2, max_epochs: 1, objective: val_label_accuracy}
parameters:
  training.optimizer.learning_rate: {type: log_uniform, min: 1.0e-3, max: 3.0e-2}
  model.dropout: {type: uniform, min: 0.0, max: 0.3}
  model.stem_filters: {type: int, min: 4, max: 8, step: 4}
  model.stages: {type: choice, values: [[4], [4, 8]]}
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An experiment directory with a tiny 3-class 8x8 image dataset built by the pipeline."""
    root = tmp_path_factory.mktemp("tuning")
    rng = np.random.default_rng(0)
    labels = np.arange(96) % 3
    images = (rng.random((96, 8, 8)) * 80 + labels[:, None, None] * 80).astype(np.uint8)
    np.savez(root / "raw.npz", images=images, target=labels)
    spec = write(
        root / "tiny.yaml",
        "name: tiny\n"
        "sources:\n"
        "  - {type: npz, path: raw.npz, arrays: {images: image, target: label}, images: [image]}\n"
        "schema:\n"
        "  image: {type: image, height: 8, width: 8, channels: 1}\n"
        "  label: {type: categorical}\n"
        "labels: [label]\n"
        "split: {ratios: {train: 0.75, validation: 0.25}, seed: s}\n"
        "output: {num_shards: 1}\n",
    )
    build_dataset(load_spec(spec), root / "experiments" / "data" / "tiny")
    write(root / "experiments" / "tiny_cnn.yaml", EXPERIMENT)
    # the quickest model to trace, for the searches that only exercise the tuners
    mlp = EXPERIMENT.replace("{type: cnn, stem_filters: 4, stages: [4], dropout: 0.1}", MLP)
    write(root / "experiments" / "tiny_mlp.yaml", mlp.replace("tiny-cnn", "tiny-mlp"))
    return root / "experiments"


# -- space files -------------------------------------------------------------------------


def test_each_parameter_type_maps_to_its_keras_tuner_hyperparameter(tmp_path: Path) -> None:
    space = load_space(write(tmp_path / "space.yaml", SPACE))
    hp = keras_tuner.HyperParameters()
    defaults = space.declare(hp)
    declared = {p.name: p for p in hp.space}

    lr = declared["training.optimizer.learning_rate"]
    assert isinstance(lr, keras_tuner.engine.hyperparameters.Float)
    assert (lr.min_value, lr.max_value, lr.sampling) == (1e-3, 3e-2, "log")
    dropout = declared["model.dropout"]
    assert isinstance(dropout, keras_tuner.engine.hyperparameters.Float)
    assert (dropout.min_value, dropout.max_value, dropout.sampling) == (0.0, 0.3, "linear")
    filters = declared["model.stem_filters"]
    assert isinstance(filters, keras_tuner.engine.hyperparameters.Int)
    assert (filters.min_value, filters.max_value, filters.step) == (4, 8, 4)
    stages = declared["model.stages"]
    assert isinstance(stages, keras_tuner.engine.hyperparameters.Choice)
    assert stages.values == [0, 1] and not stages.ordered  # indices: Choice takes scalars

    assert defaults == {
        "training.optimizer.learning_rate": 1e-3,
        "model.dropout": 0.0,
        "model.stem_filters": 4,
        "model.stages": [4],
    }
    hp.values["model.stages"] = 1
    assert space.declare(hp)["model.stages"] == [4, 8]
    assert space.decode({"model.stages": 1, "model.stem_filters": 8}) == {
        "model.stem_filters": 8,
        "model.stages": [4, 8],
    }
    assert space.tuner.type == "random" and space.tuner.max_trials == 2


def test_set_path_creates_missing_mappings_and_leaves_the_input_alone() -> None:
    raw = {"training": {"epochs": 3}}
    changed = set_path(raw, "training.optimizer.learning_rate", 0.1)
    assert changed == {"training": {"epochs": 3, "optimizer": {"learning_rate": 0.1}}}
    assert raw == {"training": {"epochs": 3}}
    with pytest.raises(ValueError, match="training.epochs is int 3, not a mapping"):
        set_path(raw, "training.epochs.value", 1)


@pytest.mark.parametrize(
    ("parameter", "expected"),
    [
        ("model.dropuot: {type: uniform, min: 0.0, max: 0.3}", r"model\.dropuot: unknown key"),
        ("model.dropout: {type: uniform, min: 0.0, max: 1.5}", r"model\.dropout: .*less than 1"),
        ("model.stages.first: {type: int, min: 1, max: 4}", r"model\.stages is list"),
        ("trainig.epochs: {type: int, min: 1, max: 4}", r"trainig: unknown key"),
        ("model.stages: {type: choice, values: [[4], [0]]}", r"model\.stages\.0: .*greater than 0"),
    ],
)
def test_space_values_the_experiment_rejects_name_space_file_line_and_key(
    tmp_path: Path, parameter: str, expected: str
) -> None:
    path = write(
        tmp_path / "space.yaml",
        "tuner: {type: random}\nparameters:\n"
        "  model.stem_filters: {type: int, min: 4, max: 8}\n"
        f"  {parameter}\n",
    )
    raw = yaml.safe_load(EXPERIMENT)
    name = parameter.split(":")[0]
    with pytest.raises(ConfigError, match=rf"^{path}:4: parameters\.{name} = .*{expected}"):
        load_space(path).check(raw, base_dir=tmp_path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("parameters:\n  a.b: {type: normal}\n", r":2: parameters\.a\.b: type: expected one of"),
        (
            "parameters:\n  a: {type: uniform, min: 1, max: 1}\n",
            r":2: parameters\.a\.max: must be above min \(1\.0\)",
        ),
        ("parameters:\n  a..b: {type: int, min: 0, max: 2}\n", r":2: parameters\.a\.\.b: not a"),
        (
            "tuner:\n  type: grid\nparameters: {a: {type: int, min: 0, max: 1}}\n",
            r":2: tuner\.type",
        ),
        (
            "tuner: {factor: 1}\nparameters: {a: {type: int, min: 0, max: 1}}\n",
            r":1: tuner\.factor",
        ),
        ("tuner: {type: random}\n", r":1: parameters: required key is missing"),
    ],
)
def test_malformed_space_files_name_file_line_and_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = write(tmp_path / "space.yaml", text)
    with pytest.raises(ConfigError, match=expected) as error:
        load_space(path)
    assert str(error.value).startswith(f"{path}:")


def test_metrics_are_named_after_heads_whatever_their_number() -> None:
    one = {"label": HeadSpec(kind="classification", num_classes=3)}
    assert metric_names(one, validation=True) == [
        "loss", "label_accuracy", "val_loss", "val_label_accuracy"
    ]  # fmt: skip
    logs = {"loss": 1.0, "accuracy": 0.5, "val_loss": 2.0, "val_accuracy": 0.25}
    assert head_named(logs, ["label"]) == {
        "loss": 1.0, "label_accuracy": 0.5, "val_loss": 2.0, "val_label_accuracy": 0.25
    }  # fmt: skip
    two = {**one, "score": HeadSpec(kind="regression")}
    assert metric_names(two, validation=False) == [
        "loss", "label_loss", "label_accuracy", "score_loss", "score_mae"
    ]  # fmt: skip
    multi = {"loss": 1.0, "label_accuracy": 0.5, "score_mae": 0.1}
    assert head_named(multi, ["label", "score"]) == multi


# -- checks before any trial -------------------------------------------------------------


def test_an_objective_the_model_does_not_report_fails_before_any_trial(
    project: Path, tmp_path: Path
) -> None:
    space = write(tmp_path / "space.yaml", SPACE.replace("val_label_accuracy", "val_acc"))
    with pytest.raises(ConfigError) as error:
        run_search(project / "tiny_cnn.yaml", space, output_dir=tmp_path / "out")
    assert str(error.value).startswith(f"{space}:1: tuner.objective: ")
    assert "'val_acc'" in str(error.value) and "val_label_accuracy" in str(error.value)
    assert not (tmp_path / "out").exists()


def test_a_missing_eval_split_or_epoch_count_fails_before_any_trial(
    project: Path, tmp_path: Path
) -> None:
    experiment = write(project / "steps.yaml", EXPERIMENT.replace("epochs: 3", "steps: 10"))
    space = write(tmp_path / "space.yaml", SPACE.replace("max_epochs: 1, ", ""))
    with pytest.raises(ConfigError, match=rf"^{space}:1: tuner\.max_epochs: required"):
        plan_search(experiment, space)
    experiment = write(
        project / "dev_split.yaml", EXPERIMENT.replace("batch_size: 16", "eval_split: dev")
    )
    with pytest.raises(ConfigError, match=r"data\.eval_split: the dataset has no split 'dev'"):
        plan_search(experiment, write(tmp_path / "space.yaml", SPACE))


# -- real searches -----------------------------------------------------------------------


def tune(*argv: str | Path) -> int:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["tune", *map(str, argv)])
    return args.handler(args)


@pytest.fixture(scope="module")
def random_search(project: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``slipway tune`` with the random tuner: 2 trials of 1 epoch, its output captured."""
    space = write(tmp_path_factory.mktemp("space") / "space.yaml", SPACE)
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "console", Console(file=printed, width=200))
        code = tune(project / "tiny_cnn.yaml", "--space", space, "--overwrite")
    out = project / "runs" / "tiny-cnn" / "tuning"
    return {"code": code, "space": space, "out": out, "printed": printed.getvalue()}


def test_random_search_reports_every_trial_and_the_best(random_search: dict) -> None:
    assert random_search["code"] == 0
    results = json.loads((random_search["out"] / "results.json").read_text())
    trials = results["trials"]
    assert [t["trial_id"] for t in trials] == ["0", "1"]
    assert all(t["status"] == "COMPLETED" and t["epochs"] == 1 for t in trials)
    for trial in trials:
        assert trial["score"] == trial["metrics"]["val_label_accuracy"]
        assert set(trial["parameters"]) == {
            "training.optimizer.learning_rate", "model.dropout", "model.stem_filters",
            "model.stages",
        }  # fmt: skip
        assert 1e-3 <= trial["parameters"]["training.optimizer.learning_rate"] <= 3e-2
        assert trial["parameters"]["model.stem_filters"] in (4, 8)
        assert trial["parameters"]["model.stages"] in ([4], [4, 8])
    assert trials[0]["parameters"] != trials[1]["parameters"]
    best = max(trials, key=lambda t: t["score"])
    assert results["best_trial"] == best["trial_id"]
    assert results["objective"] == "val_label_accuracy" and results["direction"] == "max"

    printed = random_search["printed"]
    assert "random search: val_label_accuracy" in printed
    assert f"{best['trial_id']} ★" in printed
    rows = [line for line in printed.splitlines() if "completed" in line]
    assert len(rows) == 2
    for trial, row in zip(trials, rows, strict=True):
        assert (
            f"{trial['score']:.4g}" in row
            and json.dumps(trial["parameters"]["model.stages"]) in row
        )


def test_best_yaml_is_the_best_trial_as_a_runnable_experiment(
    random_search: dict, project: Path
) -> None:
    out = random_search["out"]
    results = json.loads((out / "results.json").read_text())
    best = next(t for t in results["trials"] if t["trial_id"] == results["best_trial"])
    assert results["best_config"] == str(out / "best.yaml")

    config = load_experiment(out / "best.yaml")
    values = best["parameters"]
    assert config.training.optimizer.learning_rate == values["training.optimizer.learning_rate"]
    assert config.model.root.dropout == values["model.dropout"]
    assert config.model.root.stem_filters == values["model.stem_filters"]
    assert config.model.root.stages == values["model.stages"]
    original = load_experiment(project / "tiny_cnn.yaml")
    assert config.training.epochs == original.training.epochs  # untouched keys stay
    # the same dataset and model root from the new place; a fresh run directory
    assert config.resolve(config.data.dataset).resolve() == (project / "data" / "tiny").resolve()
    assert config.resolve(config.export.model_root).resolve() == (project / "models").resolve()
    assert config.run_path.parent.resolve() == out.resolve()
    assert config.run_path.name.startswith("best-run-")


def test_best_experiments_get_a_run_directory_of_their_own(tmp_path: Path) -> None:
    raw = yaml.safe_load(EXPERIMENT)
    raw["checkpoint"] = {"directory": "ckpt", "keep": 2}

    def best(values: dict) -> dict:
        return best_experiment(raw, values, base_dir=tmp_path, directory=tmp_path / "out")

    first = best({"model.dropout": 0.2})
    assert first["run_dir"] == best({"model.dropout": 0.2})["run_dir"]  # same experiment
    assert first["run_dir"] != best({"model.dropout": 0.25})["run_dir"]
    assert first["run_dir"].startswith("best-run-")
    assert first["checkpoint"] == {"keep": 2}  # checkpoints go under the new run directory
    assert (
        first["data"]["dataset"] == "../data/tiny" and first["export"]["model_root"] == "../models"
    )
    assert raw["checkpoint"] == {"directory": "ckpt", "keep": 2}


def test_a_finished_search_resumes_without_rerunning_and_refuses_another_space(
    random_search: dict, project: Path, tmp_path: Path
) -> None:
    out = random_search["out"]
    before = json.loads((out / "results.json").read_text())["trials"]
    result = run_search(project / "tiny_cnn.yaml", random_search["space"], verbose=0)
    assert [t.to_json() for t in result.trials] == before  # nothing ran again

    other = write(tmp_path / "other.yaml", SPACE.replace("max: 0.3", "max: 0.2"))
    with pytest.raises(ConfigError, match=rf"{out / PROJECT_NAME}: holds a search of another"):
        run_search(project / "tiny_cnn.yaml", other, verbose=0)
    assert json.loads((out / "results.json").read_text())["trials"] == before


def test_trials_that_keep_failing_end_the_search_with_their_messages(
    project: Path, tmp_path: Path
) -> None:
    # every value passes the schema, but the dataset has no such label: each trial fails
    space = write(
        tmp_path / "space.yaml",
        "tuner: {max_trials: 5, max_epochs: 1}\n"
        "parameters:\n  data.labels: {type: choice, values: [[a], [b], [c], [d]]}\n",
    )
    assert tune(project / "tiny_cnn.yaml", "--space", space, "--out", tmp_path / "out") == 1
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["best_trial"] is None and results["best_config"] is None
    assert "consecutive failures" in results["stopped"]
    assert [t["status"] for t in results["trials"]] == ["FAILED"] * 3
    assert all("not labels of the dataset" in t["message"] for t in results["trials"])
    assert not (tmp_path / "out" / "best.yaml").exists()


def test_hyperband_continues_the_best_trial_from_its_checkpoint(
    project: Path, tmp_path: Path
) -> None:
    space = write(
        tmp_path / "space.yaml",
        "tuner: {type: hyperband, max_trials: 3, max_epochs: 2, factor: 2, objective: val_loss}\n"
        "parameters:\n"
        "  training.optimizer.learning_rate: {type: log_uniform, min: 1.0e-3, max: 3.0e-2}\n",
    )
    result = run_search(project / "tiny_mlp.yaml", space, output_dir=tmp_path / "out", verbose=0)
    assert [t.status for t in result.trials] == ["COMPLETED"] * 3
    assert [t.epochs for t in result.trials] == [1, 1, 2]
    first_round = min(result.trials[:2], key=lambda t: t.score)
    continued = result.trials[2]
    assert continued.values == first_round.values
    stored = json.loads((tmp_path / "out" / PROJECT_NAME / "trial_2" / "trial.json").read_text())[
        "hyperparameters"
    ]["values"]
    assert stored["tuner/trial_id"] == first_round.trial_id and stored["tuner/initial_epoch"] == 1
    # it continued from that trial's checkpoint, optimizer state included: 2 epochs of updates
    batches = math.ceil(load_manifest(project / "data" / "tiny").splits["train"].num_records / 16)
    assert [
        optimizer_iterations(tmp_path / "out" / PROJECT_NAME / f"trial_{trial_id}")
        for trial_id in (first_round.trial_id, continued.trial_id)
    ] == [batches, 2 * batches]
    assert result.direction == "min"
    assert result.best is min(result.trials, key=lambda t: t.score)


def optimizer_iterations(trial_dir: Path) -> int:
    """The optimizer step stored in a trial's best-epoch checkpoint (tf_keras weights.h5)."""
    with h5py.File(trial_dir / "checkpoint.weights.h5", "r") as weights:
        return int(weights["optimizer/vars/0"][()])


def test_bayesian_search_runs_its_model_guided_trial(project: Path, tmp_path: Path) -> None:
    space = write(
        tmp_path / "space.yaml",
        "tuner: {type: bayesian, max_trials: 2, max_epochs: 1, initial_points: 1, seed: 4}\n"
        "parameters:\n"
        "  training.optimizer.learning_rate: {type: log_uniform, min: 1.0e-3, max: 3.0e-2}\n"
        "  data.batch_size: {type: choice, values: [16, 32]}\n",
    )
    result = run_search(project / "tiny_mlp.yaml", space, output_dir=tmp_path / "out", verbose=0)
    assert [t.status for t in result.trials] == ["COMPLETED"] * 2
    assert result.trials[0].values != result.trials[1].values
    assert all(t.values["data.batch_size"] in (16, 32) for t in result.trials)
    assert result.best is min(result.trials, key=lambda t: t.score)
    best = load_experiment(result.best_config_path)
    assert best.data.batch_size == result.best.values["data.batch_size"]
