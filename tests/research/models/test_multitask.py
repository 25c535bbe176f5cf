from __future__ import annotations

import numpy as np
import pytest
import tf_keras as keras

from contracts.yaml_config import ConfigError, parse_model
from research.models import HeadSpec, ModelConfig, MultiTaskConfig
from research.models.endpoints import compile_args
from research.models.losses import RegressionMeanSquaredError
from research.models.registry import build_model
from tests.support.keras_checks import (
    assert_config_round_trip,
    assert_saved_model_round_trip,
    train,
)

INPUTS = {"measurements": {"kind": "numeric", "shape": [6]}}
CONFIG = {
    "type": "multitask",
    "trunk": {"type": "mlp", "hidden_units": [16]},
    "head_hidden_units": [8],
}


def _heads(price_weight: float = 1.0) -> dict[str, HeadSpec]:
    return {
        "category": HeadSpec(kind="classification", num_classes=3),
        "price": HeadSpec(kind="regression", loss_weight=price_weight),
    }


def _data(n: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    labels = {
        "category": np.digitize(x[:, 0], [-0.5, 0.5]),
        "price": (x[:, 1] * 2.0 + x[:, 2]).astype(np.float32),
    }
    return {"measurements": x}, labels


def _model(heads: dict[str, HeadSpec], config: dict = CONFIG) -> keras.Model:
    parsed = parse_model(config, ModelConfig)
    assert isinstance(parsed.root, MultiTaskConfig)
    return build_model(parsed, INPUTS, heads)


def test_one_named_output_per_label() -> None:
    keras.utils.set_random_seed(0)
    model = _model(_heads())
    assert sorted(model.output_names) == ["category", "price"]
    outputs = model(_data(5)[0])
    assert outputs["category"].shape == (5, 3) and outputs["price"].shape == (5, 1)
    assert {"category_hidden_0", "price_hidden_0"} <= {layer.name for layer in model.layers}


def test_compile_args_follow_head_kinds_and_weights() -> None:
    args = compile_args(_heads(price_weight=0.25))
    assert args["loss_weights"] == {"category": 1.0, "price": 0.25}
    assert isinstance(args["loss"]["category"], keras.losses.SparseCategoricalCrossentropy)
    assert isinstance(args["loss"]["price"], RegressionMeanSquaredError)
    assert [m.name for m in args["metrics"]["category"]] == ["accuracy"]
    assert [m.name for m in args["metrics"]["price"]] == ["mae", "r2"]


def test_total_loss_is_the_weighted_sum() -> None:
    keras.utils.set_random_seed(0)
    heads = _heads(price_weight=0.25)
    model = _model(heads)
    model.compile(optimizer="adam", **compile_args(heads))
    features, labels = _data(64)
    result = model.evaluate(features, labels, batch_size=64, verbose=0, return_dict=True)
    expected = result["category_loss"] + 0.25 * result["price_loss"]
    assert result["loss"] == pytest.approx(expected, rel=1e-5)


def test_zero_weight_task_does_not_train_its_head() -> None:
    keras.utils.set_random_seed(0)
    heads = _heads(price_weight=0.0)
    model = _model(heads)
    frozen = [w.copy() for w in model.get_layer("price_dense").get_weights()]
    learning = [w.copy() for w in model.get_layer("category_logits").get_weights()]
    features, labels = _data(64)
    train(model, heads, features, labels, epochs=1)
    for before, after in zip(frozen, model.get_layer("price_dense").get_weights(), strict=True):
        np.testing.assert_array_equal(before, after)
    assert not np.allclose(learning[0], model.get_layer("category_logits").get_weights()[0])


def test_training_reduces_the_weighted_loss() -> None:
    keras.utils.set_random_seed(0)
    heads = _heads()
    model = _model(heads)
    features, labels = _data(128)
    before, after = train(model, heads, features, labels, epochs=10)
    assert after < 0.5 * before


@pytest.mark.parametrize(
    ("trunk", "inputs", "features"),
    [
        (
            {"type": "cnn", "stem_filters": 4, "stages": [4]},
            {"image": {"kind": "image", "shape": [8, 8]}},
            {"image": np.zeros((2, 8, 8), np.float32)},
        ),
        (
            {"type": "transformer", "num_layers": 1, "d_model": 8, "num_heads": 2, "ff_dim": 8},
            {"text": {"kind": "tokens", "shape": [5], "vocab_size": 9}},
            {"text": np.array([[1, 2, 3, 0, 0], [4, 0, 0, 0, 0]])},
        ),
    ],
)
def test_any_pooled_trunk(trunk: dict, inputs: dict, features: dict) -> None:
    keras.utils.set_random_seed(0)
    model = build_model({"type": "multitask", "trunk": trunk}, inputs, _heads())
    outputs = model(features)
    assert outputs["category"].shape == (2, 3) and outputs["price"].shape == (2, 1)
    assert_config_round_trip(model, features)


def test_saved_model_round_trip(tmp_path) -> None:
    keras.utils.set_random_seed(0)
    assert_saved_model_round_trip(
        _model(_heads()), {"measurements": _data(3)[0]["measurements"]}, tmp_path
    )


def test_gpt_cannot_be_a_trunk() -> None:
    with pytest.raises(
        ConfigError, match=r"trunk: type: expected one of mlp, cnn, transformer, got 'gpt'"
    ):
        parse_model({"type": "multitask", "trunk": {"type": "gpt"}}, ModelConfig)


def test_nested_trunk_errors_name_the_path() -> None:
    with pytest.raises(ConfigError, match=r"trunk\.hidden_units\.0: expected int, got 'wide'"):
        parse_model(
            {"type": "multitask", "trunk": {"type": "mlp", "hidden_units": ["wide"]}}, ModelConfig
        )
