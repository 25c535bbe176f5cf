from __future__ import annotations

import numpy as np
import pytest
import tf_keras as keras

from contracts.yaml_config import ConfigError, parse_model
from research.models import HeadSpec, ModelConfig, TransformerConfig
from research.models.registry import build_model
from tests.support.keras_checks import (
    assert_config_round_trip,
    assert_saved_model_round_trip,
    train,
)

INPUTS = {"review": {"kind": "tokens", "shape": [10], "vocab_size": 20}}
HEADS = {"sentiment": HeadSpec(kind="classification", num_classes=2)}
SMALL = {"type": "transformer", "num_layers": 1, "d_model": 16, "num_heads": 2, "ff_dim": 32}


def _model(**overrides: object) -> keras.Model:
    config = parse_model({**SMALL, **overrides}, ModelConfig)
    assert isinstance(config.root, TransformerConfig)
    return build_model(config, INPUTS, HEADS)


def _reviews(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random token ids, right-padded with 0 to random lengths 3..10."""
    ids = rng.integers(1, 20, size=(n, 10))
    lengths = rng.integers(3, 11, size=n)
    ids[np.arange(10)[np.newaxis, :] >= lengths[:, np.newaxis]] = 0
    return ids


@pytest.mark.parametrize(("norm", "pooling"), [("pre", "mean"), ("post", "cls")])
def test_layouts_give_named_probabilities(norm: str, pooling: str) -> None:
    keras.utils.set_random_seed(0)
    model = _model(norm=norm, pooling=pooling, dropout=0.0)
    assert model.input_names == ["review"] and model.output_names == ["sentiment"]
    probabilities = model({"review": _reviews(np.random.default_rng(0), 4)})["sentiment"].numpy()
    assert probabilities.shape == (4, 2)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    assert ("encoder_cls" in {layer.name for layer in model.layers}) == (pooling == "cls")


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_padding_is_masked_out(pooling: str) -> None:
    """Trailing padding gives the same prediction as the unpadded sequence."""
    keras.utils.set_random_seed(0)
    model = build_model(
        {**SMALL, "pooling": pooling, "dropout": 0.0, "max_length": 10},
        {"review": {"kind": "tokens", "shape": [None], "vocab_size": 20}},
        HEADS,
    )
    bare = model({"review": np.array([[4, 9, 2]])})["sentiment"].numpy()
    padded = model({"review": np.array([[4, 9, 2, 0, 0, 0, 0]])})["sentiment"].numpy()
    longer = model({"review": np.array([[4, 9, 2, 7]])})["sentiment"].numpy()
    np.testing.assert_allclose(padded, bare, rtol=1e-5, atol=1e-6)
    assert not np.allclose(longer, bare)


def test_config_round_trip() -> None:
    keras.utils.set_random_seed(0)
    assert_config_round_trip(
        _model(pooling="cls"), {"review": _reviews(np.random.default_rng(1), 3)}
    )


def test_training_reduces_loss() -> None:
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(2)
    reviews = _reviews(rng, 128)
    # Positive when the review mentions token 5 anywhere.
    labels = (reviews == 5).any(axis=1).astype(np.int64)
    before, after = train(
        _model(dropout=0.0), HEADS, {"review": reviews}, {"sentiment": labels}, epochs=6
    )
    assert after < 0.7 * before


def test_saved_model_round_trip(tmp_path) -> None:
    keras.utils.set_random_seed(0)
    assert_saved_model_round_trip(
        _model(pooling="cls"), {"review": _reviews(np.random.default_rng(3), 2)}, tmp_path
    )


def test_sequence_longer_than_max_length_is_refused() -> None:
    with pytest.raises(ValueError, match=r"max_length: input .* has length 10 > 8"):
        _model(max_length=8)


def test_width_must_split_across_heads() -> None:
    with pytest.raises(ConfigError, match=r"d_model: 30 is not divisible by num_heads=4"):
        parse_model({"type": "transformer", "d_model": 30, "num_heads": 4}, ModelConfig)
