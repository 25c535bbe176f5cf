from __future__ import annotations

import pytest

from contracts.features import FeatureSpec
from contracts.yaml_config import ConfigError, StrictModel, load_yaml_model, parse_model
from research.models import (
    CnnConfig,
    HeadSpec,
    InputSpec,
    ModelConfig,
    head_spec_from_feature,
    input_spec_from_feature,
)
from research.models.registry import build_model


class Experiment(StrictModel):
    model: ModelConfig


def test_experiment_file_holds_a_typed_model(tmp_path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("model:\n  type: cnn\n  stages: [8, 16, 32]\n")
    experiment = load_yaml_model(path, Experiment)
    assert experiment.model.root == CnnConfig(stages=[8, 16, 32])


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        (
            "model:\n  type: cnn\n  stages: [8, x]\n",
            r"exp\.yaml:3: model\.stages\.1: expected int, got 'x'",
        ),
        ("model:\n  type: mlp\n  hidden: [8]\n", r"exp\.yaml:3: model\.hidden: unknown key"),
        (
            "model:\n  type: rnn\n",
            r"exp\.yaml:\d: model: type: expected one of mlp, cnn, transformer, gpt, multitask, python, got 'rnn'",
        ),
        ("model:\n  hidden_units: [8]\n", r"model: type: required key is missing"),
        (
            "model:\n  type: transformer\n  norm: middle\n",
            r"model\.norm: expected one of 'pre' or 'post'",
        ),
        ("model:\n  type: mlp\n  dropout: 1.5\n", r"model\.dropout: Input should be less than 1"),
    ],
)
def test_config_errors_name_file_line_and_key(tmp_path, yaml_text: str, message: str) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=message):
        load_yaml_model(path, Experiment)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"kind": "tokens", "shape": [8]}, r"vocab_size: required for tokens inputs"),
        (
            {"kind": "tokens", "shape": [8], "vocab_size": 9, "dtype": "float32"},
            r"dtype: tokens inputs hold integer ids",
        ),
        ({"kind": "image", "shape": [64]}, r"shape: images are \(height, width\[, channels\]\)"),
        ({"kind": "numeric", "vocab_size": 3}, r"vocab_size: only categorical and tokens inputs"),
        ({"kind": "numeric", "dtype": "int64"}, r"dtype: numeric inputs are read as float32"),
        (
            {"kind": "numeric", "shape": [None]},
            r"shape: only tokens inputs may have an unknown length",
        ),
        (
            {"kind": "categorical", "shape": [3], "vocab_size": 4},
            r"shape: categorical inputs hold one id",
        ),
    ],
)
def test_bad_input_specs(spec: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_model(spec, InputSpec)


def test_id_inputs_default_to_int64() -> None:
    assert InputSpec(kind="tokens", shape=(4,), vocab_size=5).dtype == "int64"
    assert InputSpec(kind="categorical", vocab_size=5).dtype == "int64"
    assert InputSpec(kind="numeric").dtype == "float32"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"kind": "classification"}, r"num_classes: classification heads need at least 2"),
        ({"kind": "regression", "num_classes": 3}, r"num_classes: only classification heads"),
        ({"kind": "language_model", "units": 2}, r"units: only regression heads"),
        (
            {"kind": "regression", "loss_weight": -1},
            r"loss_weight: Input should be greater than or equal to 0",
        ),
    ],
)
def test_bad_head_specs(spec: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_model(spec, HeadSpec)


def test_build_model_validates_plain_mappings_with_their_path() -> None:
    with pytest.raises(ConfigError, match=r"^build_model: model\.stem_filters: expected int"):
        build_model(
            {"type": "cnn", "stem_filters": "many"},
            {"x": {"shape": [2]}},
            {"y": {"kind": "regression"}},
        )
    with pytest.raises(ConfigError, match=r"^build_model: inputs\.image: shape: images are"):
        build_model(
            {"type": "cnn"},
            {"image": {"kind": "image", "shape": [4]}},
            {"y": {"kind": "regression"}},
        )
    with pytest.raises(ConfigError, match=r"^build_model: heads\.y: num_classes"):
        build_model({"type": "mlp"}, {"x": {"shape": [2]}}, {"y": {"kind": "classification"}})


@pytest.mark.parametrize(
    ("inputs", "heads", "message"),
    [
        (
            {"text/token_ids": {"shape": [2]}},
            {"y": {"kind": "regression"}},
            r"'text/token_ids' cannot name",
        ),
        (
            {"x": {"shape": [2]}},
            {"x": {"kind": "regression"}},
            r"both an input and a head: \['x'\]",
        ),
        ({}, {"y": {"kind": "regression"}}, r"at least one input"),
        ({"x": {"shape": [2]}}, {}, r"at least one head"),
        (
            {"x": {"shape": [2]}},
            {"y": {"kind": "language_model"}},
            r"language_model head needs the gpt",
        ),
    ],
)
def test_build_model_refuses_unusable_endpoints(inputs: dict, heads: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_model({"type": "mlp"}, inputs, heads)


def test_input_specs_from_manifest_features() -> None:
    numeric = FeatureSpec(name="x", type="numeric", dtype="int64", shape=(3,))
    colour = FeatureSpec(name="colour", type="categorical", vocabulary=("red", "green"))
    text = FeatureSpec(name="text", type="text", vocab_size=500)
    image = FeatureSpec(name="image", type="image", height=28, width=28, channels=1)
    assert input_spec_from_feature(numeric) == InputSpec(shape=(3,))
    # One id more than the vocabulary: the reader's out-of-vocabulary id.
    assert input_spec_from_feature(colour) == InputSpec(kind="categorical", vocab_size=3)
    assert input_spec_from_feature(text, sequence_length=64) == InputSpec(
        kind="tokens", shape=(64,), vocab_size=500
    )
    assert input_spec_from_feature(image) == InputSpec(kind="image", shape=(28, 28, 1))
    with pytest.raises(ValueError, match="no vocab_size"):
        input_spec_from_feature(FeatureSpec(name="text", type="text"))


def test_head_specs_from_manifest_labels() -> None:
    species = FeatureSpec(name="species", type="categorical", vocabulary=("a", "b", "c"))
    price = FeatureSpec(name="price", type="numeric")
    digit = FeatureSpec(name="digit", type="numeric", dtype="int64")
    assert head_spec_from_feature(species) == HeadSpec(kind="classification", num_classes=3)
    assert head_spec_from_feature(price, loss_weight=0.5) == HeadSpec(
        kind="regression", loss_weight=0.5
    )
    assert head_spec_from_feature(digit, num_classes=10) == HeadSpec(
        kind="classification", num_classes=10
    )
    with pytest.raises(ValueError, match="cannot be a label"):
        head_spec_from_feature(FeatureSpec(name="text", type="text"))


@pytest.mark.parametrize(
    ("statistics", "scale"),
    [
        ({"mean": 152.9, "std": 77.1}, (152.9, 77.1)),
        ({"mean": 4.0, "std": 0.0}, (4.0, 1.0)),  # a constant label: no spread to scale by
        ({"mean": float("inf"), "std": 2.0}, (0.0, 1.0)),
        ({"mean": 1.0, "std": float("nan")}, (1.0, 1.0)),
        ({}, (0.0, 1.0)),
    ],
)
def test_a_regression_head_rescales_by_the_labels_training_statistics(
    statistics: dict, scale: tuple[float, float]
) -> None:
    price = FeatureSpec(name="price", type="numeric")
    head = head_spec_from_feature(price, statistics=statistics)
    assert (head.target_mean, head.target_std) == scale


def test_only_regression_heads_rescale() -> None:
    with pytest.raises(ValueError, match="only regression heads rescale"):
        HeadSpec(kind="classification", num_classes=2, target_mean=3.0)
