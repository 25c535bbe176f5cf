"""Checks every zoo model must pass, shared by the per-family test files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf
import tf_keras as keras

from research.models import HeadSpec
from research.models.endpoints import compile_args


def predict(model: keras.Model, features: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    outputs = model(features, training=False)
    return {name: np.asarray(value) for name, value in outputs.items()}


def assert_same_predictions(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6)


def assert_config_round_trip(model: keras.Model, features: dict[str, np.ndarray]) -> None:
    """get_config/from_config, JSON and clone_model rebuild the same architecture."""
    expected = predict(model, features)
    rebuilt = [
        keras.Model.from_config(model.get_config()),
        keras.models.model_from_json(model.to_json()),
        keras.models.clone_model(model),
    ]
    for copy in rebuilt:
        assert [layer.name for layer in copy.layers] == [layer.name for layer in model.layers]
        copy.set_weights(model.get_weights())
        assert_same_predictions(predict(copy, features), expected)


def assert_saved_model_round_trip(
    model: keras.Model, features: dict[str, np.ndarray], directory: Path
) -> None:
    """The SavedModel reloads with equal predictions and a signature named after the data."""
    expected = predict(model, features)
    path = str(directory / "saved_model")
    model.save(path, save_format="tf")
    assert_same_predictions(predict(keras.models.load_model(path), features), expected)
    signature = tf.saved_model.load(path).signatures["serving_default"]
    _, inputs = signature.structured_input_signature
    assert set(inputs) == set(features)
    # A client sends each input in the signature's dtype (int64 counts become float32).
    served = signature(
        **{name: tf.constant(value, dtype=inputs[name].dtype) for name, value in features.items()}
    )
    assert set(served) == set(expected)
    assert_same_predictions({name: value.numpy() for name, value in served.items()}, expected)


def train(
    model: keras.Model,
    heads: dict[str, HeadSpec],
    features: dict[str, np.ndarray],
    labels: dict[str, np.ndarray],
    *,
    epochs: int,
    learning_rate: float = 1e-2,
) -> tuple[float, float]:
    """Fit briefly; the mean training loss of the first and of the last epoch.

    Training-mode losses, not ``evaluate``: batch norm's moving statistics lag far
    behind after a handful of steps, which would hide what the weights learned.
    """
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), **compile_args(heads))
    history = model.fit(features, labels, batch_size=16, epochs=epochs, shuffle=False, verbose=0)
    return history.history["loss"][0], history.history["loss"][-1]
