"""Search space files: their parameters, and the checks that name file, line and key."""

from __future__ import annotations

from pathlib import Path

import keras_tuner
import pytest
import yaml

from contracts.yaml_config import ConfigError
from research.tuning.space import load_space, set_path
from tests.support.tuning_files import EXPERIMENT, SPACE, write

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
