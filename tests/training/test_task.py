"""The experiment Task: one interface for zoo models and a researcher's own model_fn."""

from __future__ import annotations

import json

import pytest
import tf_keras as keras

from contracts.yaml_config import ConfigError
from research.experiments import load_experiment
from research.experiments.task import ExperimentTask
from research.models.specs import ModelInterfaceError
from tests.support.experiments import write_experiment
from training.run import train


def sequential(inputs, heads):
    """A Sequential model: one unnamed input and an unnamed output, as Keras tutorials write."""
    return keras.Sequential(
        [
            keras.layers.Dense(32, activation="relu", input_shape=inputs["pixels"].shape),
            keras.layers.Dense(heads["label"].num_classes, activation="softmax"),
        ]
    )


def test_a_model_fn_replaces_the_model_section_and_trains_like_the_zoo(tmp_path, digits_dataset):
    path = write_experiment(tmp_path, digits_dataset, model=None, training__steps=30)
    task = ExperimentTask(load_experiment(path), model_fn=sequential)
    model = task.build_model()
    assert model.input_names == ["pixels"] and model.output_names == ["label"]

    outcome = train(task, progress=False)

    assert outcome.exit_code == 0 and outcome.step == 30
    assert outcome.metrics["validation"]["label_accuracy"] > 0.5
    version, directory = outcome.published
    manifest = json.loads((directory / "slipway.json").read_text())
    assert version == 1 and directory == tmp_path / "models" / "mlp" / "1"
    assert list(manifest["signature"]["inputs"]) == ["pixels"]
    assert list(manifest["signature"]["outputs"]) == ["label", "label_classes"]
    assert manifest["provenance"]["model_fn"] == f"{__name__}:sequential"


def test_an_experiment_without_a_model_needs_a_model_fn(tmp_path, digits_dataset):
    path = write_experiment(tmp_path, digits_dataset, model=None)
    with pytest.raises(ConfigError, match=rf"^{path}: model: required key is missing"):
        ExperimentTask(load_experiment(path))


def test_a_model_that_does_not_fit_the_dataset_is_refused_before_training(tmp_path, digits_dataset):
    def three_classes(inputs, heads):
        pixels = keras.Input(inputs["pixels"].shape, name="pixels")
        return keras.Model(pixels, {"label": keras.layers.Dense(3, name="label")(pixels)})

    task = ExperimentTask(
        load_experiment(write_experiment(tmp_path, digits_dataset)), model_fn=three_classes
    )
    with pytest.raises(ModelInterfaceError, match="label"):
        task.build_model()


def test_experiment_and_dataset_mismatches_name_the_file_and_key(tmp_path, digits_dataset):
    bad_feature = write_experiment(tmp_path / "a", digits_dataset, data__features=["pixel"])
    with pytest.raises(
        ConfigError,
        match=rf"^{bad_feature}: data.features: not input features of the dataset: \['pixel'\]",
    ):
        ExperimentTask(load_experiment(bad_feature))
    bad_split = write_experiment(tmp_path / "b", digits_dataset, data__eval_split="dev")
    with pytest.raises(ConfigError, match=rf"^{bad_split}: data.eval_split: .* no split 'dev'"):
        ExperimentTask(load_experiment(bad_split))
