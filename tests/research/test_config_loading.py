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


def test_unknown_key_is_rejected(tmp_path):
    path = write(tmp_path, "name: a\ntraining:\n  batch_sise: 8\n")
    with pytest.raises(ConfigError, match=r":3: training.batch_sise: unknown key"):
        load_yaml_model(path, Experiment)


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
