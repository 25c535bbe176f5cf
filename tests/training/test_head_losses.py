"""Every head type's loss, as the trainer computes it and as ``model.fit`` does.

The trainer sums one loss per example over its global batch and divides once, so each
head's loss must give exactly one value per example: a regression loss that averaged
over the batch axis instead scaled every update by 1/batch without a word. Each case
checks the per-example shape, the trainer's batch loss against Keras' compiled loss for
the same model, weights and batch, and (where it is simple) against numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from contracts.yaml_config import parse_model
from research.models import HeadSpec, ModelConfig
from research.models.endpoints import compile_args
from research.models.registry import build_model
from training.trainer import Evaluation, per_example_losses, weighted_example_losses

BATCH = 12
VOCAB = 16
rng = np.random.default_rng(0)

Batch = tuple[dict[str, np.ndarray], dict[str, np.ndarray]]


def _numbers(width: int = 5) -> dict[str, np.ndarray]:
    return {"measurements": rng.normal(size=(BATCH, width)).astype(np.float32)}


def classification() -> tuple[dict[str, Any], dict[str, HeadSpec], Batch]:
    heads = {"kind": HeadSpec(kind="classification", num_classes=4)}
    return (
        {"type": "mlp", "hidden_units": [8]},
        heads,
        (_numbers(), {"kind": rng.integers(0, 4, BATCH)}),
    )


def regression() -> tuple[dict[str, Any], dict[str, HeadSpec], Batch]:
    """A scalar label arrives as ``[batch]``; its head predicts ``[batch, 1]``."""
    heads = {"price": HeadSpec(kind="regression", target_mean=150.0, target_std=80.0)}
    labels = {"price": rng.normal(150.0, 80.0, BATCH).astype(np.float32)}
    return {"type": "mlp", "hidden_units": [8]}, heads, (_numbers(), labels)


def vector_regression() -> tuple[dict[str, Any], dict[str, HeadSpec], Batch]:
    heads = {"position": HeadSpec(kind="regression", units=3)}
    labels = {"position": rng.normal(size=(BATCH, 3)).astype(np.float32)}
    return {"type": "mlp", "hidden_units": []}, heads, (_numbers(), labels)


def multitask() -> tuple[dict[str, Any], dict[str, HeadSpec], Batch]:
    heads = {
        "kind": HeadSpec(kind="classification", num_classes=3, loss_weight=0.7),
        "price": HeadSpec(kind="regression", loss_weight=0.25, target_mean=10.0),
        "position": HeadSpec(kind="regression", units=2, loss_weight=2.0),
    }
    labels = {
        "kind": rng.integers(0, 3, BATCH),
        "price": rng.normal(10.0, 1.0, BATCH).astype(np.float32),
        "position": rng.normal(size=(BATCH, 2)).astype(np.float32),
    }
    config = {"type": "multitask", "trunk": {"type": "mlp", "hidden_units": [8]}}
    return config, heads, (_numbers(), labels)


def language_model() -> tuple[dict[str, Any], dict[str, HeadSpec], Batch]:
    """Sequences of different real lengths: each counts once, however long."""
    ids = rng.integers(1, VOCAB, size=(BATCH, 9))
    for row, length in enumerate(rng.integers(2, 10, BATCH)):
        ids[row, length:] = 0
    config = {"type": "gpt", "num_layers": 1, "d_model": 8, "num_heads": 2, "ff_dim": 16}
    config["max_length"] = 12
    heads = {"next_token": HeadSpec(kind="language_model")}
    return config, heads, ({"tokens": ids[:, :-1]}, {"next_token": ids[:, 1:]})


CASES: dict[str, Callable[[], tuple[dict[str, Any], dict[str, HeadSpec], Batch]]] = {
    "classification": classification,
    "regression": regression,
    "vector_regression": vector_regression,
    "multitask": multitask,
    "language_model": language_model,
}


def _model(config: dict[str, Any], heads: dict[str, HeadSpec], features: Any) -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = {
        name: {"kind": "tokens", "shape": [None], "vocab_size": VOCAB}
        if name == "tokens"
        else {"kind": "numeric", "shape": list(value.shape[1:])}
        for name, value in features.items()
    }
    return build_model(parse_model(config, ModelConfig), inputs, heads)


@pytest.mark.parametrize("case", list(CASES))
def test_the_trainers_batch_loss_is_what_keras_compiles(case: str) -> None:
    config, heads, (features, labels) = CASES[case]()
    model = _model(config, heads, features)
    outputs = model(features, training=False)
    args = compile_args(heads)
    example_losses = weighted_example_losses(
        per_example_losses(args["loss"]), args["loss_weights"], labels, outputs
    )
    assert example_losses.shape == (BATCH,)
    trainer_loss = float(tf.reduce_sum(example_losses)) / BATCH

    model.compile(optimizer="sgd", **args)
    keras_loss = model.test_on_batch(features, labels, return_dict=True)["loss"]
    assert trainer_loss == pytest.approx(keras_loss, rel=1e-6)


def test_a_regression_loss_is_the_mean_squared_error_in_the_labels_units() -> None:
    _, heads, (features, labels) = regression()
    model = _model({"type": "mlp", "hidden_units": [8]}, heads, features)
    predicted = model(features, training=False)["price"].numpy()
    assert predicted.shape == (BATCH, 1)
    (loss,) = per_example_losses(compile_args(heads)["loss"]).values()
    per_example = loss(labels["price"], predicted).numpy()
    np.testing.assert_allclose(per_example, (predicted[:, 0] - labels["price"]) ** 2, rtol=1e-6)


def test_evaluation_leaves_out_masked_examples_of_regression_heads() -> None:
    """The padding that completes a split's last global batch is masked out of the loss,
    the MAE and R²; a scalar label's ``[batch]`` mask meets its ``[batch, 1]`` head."""
    config, heads, (features, labels) = multitask()
    model = _model(config, heads, features)
    args = compile_args(heads)
    mask = np.array([1.0] * 9 + [0.0] * 3, dtype=np.float32)
    evaluation = Evaluation(per_example_losses(args["loss"]), args["metrics"])
    outputs = model(features, training=False)
    evaluation.update({k: tf.constant(v) for k, v in labels.items()}, outputs, tf.constant(mask))
    results = evaluation.results(args["loss_weights"])

    kept = mask.astype(bool)
    price, truth = outputs["price"].numpy()[kept, 0], labels["price"][kept]
    assert results["examples"] == 9
    assert results["price_loss"] == pytest.approx(np.mean((price - truth) ** 2), rel=1e-5)
    assert results["price_mae"] == pytest.approx(np.mean(np.abs(price - truth)), rel=1e-5)
    r2 = 1 - np.sum((truth - price) ** 2) / np.sum((truth - truth.mean()) ** 2)
    assert results["price_r2"] == pytest.approx(r2, rel=1e-4)
    position, target = outputs["position"].numpy()[kept], labels["position"][kept]
    assert results["position_mae"] == pytest.approx(np.mean(np.abs(position - target)), rel=1e-5)


def test_a_regression_head_predicts_in_the_labels_units_from_the_start() -> None:
    """A fresh head's output is centred on the training mean, spread by the training std:
    a target around 150 starts near 150, not near 0."""
    heads = {"price": HeadSpec(kind="regression", target_mean=150.0, target_std=80.0)}
    features = {"measurements": rng.normal(size=(512, 5)).astype(np.float32)}
    model = _model({"type": "mlp", "hidden_units": []}, heads, features)
    predicted = model(features)["price"].numpy()
    assert abs(predicted.mean() - 150.0) < 0.1 * 80.0
    assert predicted.dtype == np.float32
