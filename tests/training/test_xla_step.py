"""The replica step compiled with XLA, and the fallback for models XLA cannot compile."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from research.experiments import load_experiment
from research.experiments.task import ExperimentTask
from tests.support.experiments import make_trainer, run, write_experiment
from training.distribution import WorkerRole, choose_strategy
from training.errors import TrainingSetupError
from training.trainer import Trainer


class ThroughStrings(keras.layers.Layer):
    """The identity, by way of a string op XLA has no kernel for (as a researcher's
    model may hold: a hashing or text op inside the model)."""

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        digits = tf.strings.length(tf.strings.as_string(inputs[:, :1]))
        return inputs + 0.0 * tf.cast(digits, inputs.dtype)


def with_string_op(inputs, heads):
    pixels = keras.Input(inputs["pixels"].shape, name="pixels")
    hidden = keras.layers.Dense(16, activation="relu")(ThroughStrings()(pixels))
    label = keras.layers.Dense(heads["label"].num_classes, name="label")(hidden)
    return keras.Model(pixels, {"label": label})


def custom_trainer(path) -> Trainer:
    role = WorkerRole(index=0, count=1)
    task = ExperimentTask(load_experiment(path), model_fn=with_string_op)
    return Trainer(task, choose_strategy(role), role)


def events(run_dir) -> list[str]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [record["message"] for record in map(json.loads, lines) if record["kind"] == "event"]


def test_a_zoo_model_updates_through_xla_as_it_does_without(tmp_path, digits_dataset):
    trainers = {}
    for jit in ("auto", False):
        path = write_experiment(
            tmp_path / str(jit), digits_dataset, training__jit_compile=jit, model__dropout=0.0
        )
        trainers[jit] = make_trainer(path)
        first = trainers[jit].train(4, stop_requested=False)
        trainers[jit].train(6, stop_requested=False)
        assert (first.note is not None) == (jit == "auto")

    compiled, plain = trainers["auto"], trainers[False]
    assert compiled.jit_compiled and not plain.jit_compiled
    assert compiled.step == plain.step == 10
    for ours, theirs in zip(compiled.model.weights, plain.model.weights, strict=True):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-4, atol=1e-5)


def test_a_model_xla_cannot_compile_trains_without_it_from_the_same_input(tmp_path, digits_dataset):
    fallback = custom_trainer(write_experiment(tmp_path / "auto", digits_dataset, model=None))
    outcome = run(fallback)
    plain = custom_trainer(
        write_experiment(
            tmp_path / "plain", digits_dataset, model=None, training__jit_compile=False
        )
    )
    run(plain)

    assert outcome.exit_code == 0 and not fallback.jit_compiled
    said = [event for event in events(tmp_path / "auto" / "run") if "XLA" in event]
    assert said == [
        "XLA cannot compile this model (unsupported ops: AsString); training without it"
    ]
    # Nothing was applied twice and no batch skipped: the same weights, bit for bit.
    for ours, theirs in zip(fallback.model.weights, plain.model.weights, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_jit_compile_true_refuses_a_model_xla_cannot_compile(tmp_path, digits_dataset):
    trainer = custom_trainer(
        write_experiment(tmp_path, digits_dataset, model=None, training__jit_compile=True)
    )
    with pytest.raises(TrainingSetupError, match="jit_compile: true.*AsString.*auto or false"):
        trainer.train(2, stop_requested=False)
    assert trainer.step == 0
