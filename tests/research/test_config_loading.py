"""Config files fail with the file, line and key path a person needs to fix them."""

from __future__ import annotations

import pytest

from contracts.yaml_config import ConfigError, StrictModel, load_yaml_model


class Training(StrictModel):
    batch_size: int = 32
    learning_rate: float = 1e-3


class Experiment(StrictModel):
    name: str
    training: Training = Training()


def write(tmp_path, text: str):
    path = tmp_path / "experiment.yaml"
    path.write_text(text)
    return path


def test_valid_file_loads(tmp_path):
    config = load_yaml_model(write(tmp_path, "name: a\ntraining:\n  batch_size: 8\n"), Experiment)
    assert config.training.batch_size == 8


def test_wrong_type_names_file_line_and_path(tmp_path):
    path = write(tmp_path, "name: a\ntraining:\n  batch_size: abc\n")
    with pytest.raises(ConfigError) as error:
        load_yaml_model(path, Experiment)
    assert str(error.value) == f"{path}:3: training.batch_size: expected int, got 'abc'"


def test_unknown_key_is_rejected_with_the_sections_closest_key(tmp_path):
    path = write(tmp_path, "name: a\ntraining:\n  batch_sise: 8\n  warmup: 3\n")
    with pytest.raises(ConfigError) as error:
        load_yaml_model(path, Experiment)
    assert str(error.value).splitlines() == [
        f"{path}:3: training.batch_sise: unknown key; did you mean 'batch_size'?",
        f"{path}:4: training.warmup: unknown key",  # nothing close: no guess
    ]


def test_a_removed_key_gets_its_migration_hint(tmp_path):
    class OldTraining(Training):
        removed_keys = {"lr": "renamed: write training.learning_rate"}

    class OldExperiment(StrictModel):
        name: str
        training: OldTraining | None = None

    path = write(tmp_path, "name: a\ntraining:\n  lr: 0.1\n")
    with pytest.raises(ConfigError) as error:
        load_yaml_model(path, OldExperiment)
    assert str(error.value) == (
        f"{path}:3: training.lr: unknown key: removed; renamed: write training.learning_rate"
    )


def test_real_configs_suggest_keys_through_unions_and_mappings(tmp_path):
    """An experiment's model section is a union of families; heads a mapping of specs."""
    from research.experiments.config import ExperimentConfig

    path = write(
        tmp_path,
        "name: a\ndata: {dataset: d}\nmodel: {type: mlp, hiden_units: [3]}\n"
        "heads: {price: {kind: regression, unit: 2}}\n",
    )
    with pytest.raises(ConfigError) as error:
        load_yaml_model(path, ExperimentConfig)
    message = str(error.value)
    assert "model.hiden_units: unknown key; did you mean 'hidden_units'?" in message
    assert "heads.price.unit: unknown key; did you mean 'units'?" in message


def test_missing_required_key(tmp_path):
    with pytest.raises(ConfigError, match=r"name: required key is missing"):
        load_yaml_model(write(tmp_path, "training: {}\n"), Experiment)


def test_invalid_yaml_reports_line(tmp_path):
    path = write(tmp_path, "name: a\ntraining: [\n")
    with pytest.raises(ConfigError, match=r"invalid YAML"):
        load_yaml_model(path, Experiment)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_yaml_model(tmp_path / "nope.yaml", Experiment)


def test_non_mapping_root(tmp_path):
    with pytest.raises(ConfigError, match="expected mapping"):
        load_yaml_model(write(tmp_path, "- 1\n- 2\n"), Experiment)
