"""The zoo stays wrappable by tensorflow-model-optimization, which compression relies on."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow_model_optimization as tfmot
import tf_keras as keras

from research.models.registry import build_model

CLASSES = {"label": {"kind": "classification", "num_classes": 3}}
TOKENS = {"text": {"kind": "tokens", "shape": [6], "vocab_size": 9}}
TEXT = {"text": np.array([[1, 2, 3, 0, 0, 0]])}


@pytest.mark.parametrize(
    ("config", "inputs", "heads", "features"),
    [
        (
            {"type": "mlp", "hidden_units": [8]},
            {"x": {"shape": [4]}, "colour": {"kind": "categorical", "vocab_size": 4}},
            CLASSES,
            {"x": np.zeros((1, 4), np.float32), "colour": np.array([2])},
        ),
        (
            {"type": "cnn", "stem_filters": 4, "stages": [4, 8]},
            {"image": {"kind": "image", "shape": [8, 8]}},
            CLASSES,
            {"image": np.zeros((1, 8, 8), np.float32)},
        ),
        (
            {"type": "transformer", "num_layers": 1, "d_model": 8, "pooling": "cls"},
            TOKENS,
            CLASSES,
            TEXT,
        ),
        (
            {"type": "gpt", "num_layers": 1, "d_model": 8},
            TOKENS,
            {"next": {"kind": "language_model"}},
            TEXT,
        ),
    ],
)
def test_whole_model_pruning_wraps_every_family(config, inputs, heads, features) -> None:
    keras.utils.set_random_seed(0)
    model = build_model(config, inputs, heads)
    pruned = tfmot.sparsity.keras.prune_low_magnitude(model)
    wrapped = {
        layer.layer.__class__.__name__
        for layer in pruned.layers
        if type(layer).__name__ == "PruneLowMagnitude"
    }
    assert "Dense" in wrapped
    outputs = pruned(features)
    assert {name: value.shape for name, value in outputs.items()} == {
        name: value.shape for name, value in model(features).items()
    }
