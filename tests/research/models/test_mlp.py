from __future__ import annotations

import numpy as np
import pytest
import tf_keras as keras

from contracts.yaml_config import parse_model
from research.models import HeadSpec, MlpConfig, ModelConfig
from research.models.registry import build_model
from tests.support.keras_checks import (
    assert_config_round_trip,
    assert_saved_model_round_trip,
    train,
)

INPUTS = {
    "measurements": {"kind": "numeric", "shape": [4]},
    "count": {"kind": "numeric"},
    "colour": {"kind": "categorical", "vocab_size": 4},
    "words": {"kind": "tokens", "shape": [5], "vocab_size": 12},
}
HEADS = {"species": HeadSpec(kind="classification", num_classes=3)}


def _features(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {
        "measurements": rng.normal(size=(n, 4)).astype(np.float32),
        "count": rng.integers(0, 5, size=(n,)),
        "colour": rng.integers(0, 4, size=(n,)),
        "words": rng.integers(0, 12, size=(n, 5)),
    }


def _model(**overrides: object) -> keras.Model:
    config = parse_model({"type": "mlp", "hidden_units": [16, 8], **overrides}, ModelConfig)
    assert isinstance(config.root, MlpConfig)
    return build_model(config, INPUTS, HEADS)


def test_mixed_inputs_give_named_probabilities() -> None:
    keras.utils.set_random_seed(0)
    model = _model(batch_norm=True, dropout=0.2)
    assert sorted(model.input_names) == sorted(INPUTS)
    assert model.output_names == ["species"]
    probabilities = model(_features(np.random.default_rng(0), 6))["species"].numpy()
    assert probabilities.shape == (6, 3)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)


def test_batch_norm_and_dropout_layers_follow_config() -> None:
    plain = {layer.__class__.__name__ for layer in _model().layers}
    full = {layer.__class__.__name__ for layer in _model(batch_norm=True, dropout=0.3).layers}
    assert "BatchNormalization" not in plain and "Dropout" not in plain
    assert {"BatchNormalization", "Dropout"} <= full


def test_padding_tokens_do_not_change_the_prediction() -> None:
    keras.utils.set_random_seed(0)
    model = _model()
    features = _features(np.random.default_rng(1), 2)
    features["words"] = np.array([[3, 4, 0, 0, 0], [5, 0, 0, 0, 0]])
    longer = dict(features, words=np.array([[3, 4, 0, 0, 0, 0, 0], [5, 0, 0, 0, 0, 0, 0]]))
    wide = build_model(
        {"type": "mlp", "hidden_units": [16, 8]},
        {**INPUTS, "words": {"kind": "tokens", "shape": [7], "vocab_size": 12}},
        HEADS,
    )
    wide.set_weights(model.get_weights())
    np.testing.assert_allclose(
        wide(longer)["species"].numpy(), model(features)["species"].numpy(), rtol=1e-5
    )


def test_config_round_trip() -> None:
    keras.utils.set_random_seed(0)
    assert_config_round_trip(_model(batch_norm=True), _features(np.random.default_rng(2), 4))


def test_training_reduces_loss() -> None:
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(3)
    features = _features(rng, 128)
    labels = {
        "species": (features["measurements"][:, 0] > 0).astype(np.int64) + (features["colour"] == 3)
    }
    before, after = train(_model(), HEADS, features, labels, epochs=8)
    assert after < 0.7 * before


def test_saved_model_round_trip(tmp_path) -> None:
    keras.utils.set_random_seed(0)
    assert_saved_model_round_trip(_model(), _features(np.random.default_rng(4), 3), tmp_path)


def test_unknown_activation_is_a_config_error() -> None:
    from contracts.yaml_config import ConfigError

    with pytest.raises(ConfigError, match=r"activation: expected one of"):
        parse_model({"type": "mlp", "activation": "sigmoidal"}, ModelConfig)
