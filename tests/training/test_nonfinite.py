"""Updates that would poison a run: skipped, never committed, never exported."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from research.experiments.task import ExperimentTask
from tests.support.experiments import (
    SignalDuringUpdate,
    make_trainer,
    run,
    write_experiment,
)
from training.checkpoints import CheckpointKeeper, committed_steps
from training.export import NonFiniteWeightsError, save_serving_model

# Pixels times this give a finite loss and finite gradients whose global norm overflows
# float32: the case the loss-scale optimizer alone lets through.
HUGE = 1e36


def events(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    return [row["message"] for row in rows if row["kind"] == "event"]


def scale_training_batches(monkeypatch, batches, factor):
    """Multiply the features of the training batches numbered ``batches`` by ``factor``."""
    original = ExperimentTask.build_inputs

    def scale(index, batch):
        features, labels = batch
        hit = tf.reduce_any(tf.equal(index, batches))
        multiplier = tf.where(hit, tf.constant(factor), tf.constant(1.0))
        return {name: value * multiplier for name, value in features.items()}, labels

    def scaled(self, split, *, training=False, **kwargs):
        data = original(self, split, training=training, **kwargs)
        return data.enumerate().map(scale) if training else data

    monkeypatch.setattr(ExperimentTask, "build_inputs", scaled)


def all_finite(trainer):
    variables = [*trainer.model.weights, *trainer.optimizer.variables]
    return all(np.isfinite(v.numpy()).all() for v in variables if v.dtype.is_floating)


def test_an_overflowing_gradient_norm_skips_the_update_and_commits_nothing_in_the_streak(
    tmp_path, digits_dataset, monkeypatch
):
    scale_training_batches(monkeypatch, (6, 7), HUGE)  # the updates to steps 7 and 8
    path = write_experiment(
        tmp_path,
        digits_dataset,
        training__steps=12,
        training__optimizer={"learning_rate": 0.01, "clip_global_norm": 1.0},
        checkpoint__every_steps=1,
        checkpoint__keep=20,
    )
    trainer = make_trainer(path)
    outcome = run(trainer)

    assert outcome.exit_code == 0 and outcome.step == 12
    assert outcome.skipped_updates == 2
    assert all_finite(trainer)
    checkpoints = tmp_path / "run" / "checkpoints"
    assert sorted(committed_steps(checkpoints)) == [1, 2, 3, 4, 5, 6, 9, 10, 11, 12]
    assert sum("checkpoint not saved" in e for e in events(tmp_path / "run")) == 2
    for step in committed_steps(checkpoints):
        fresh = make_trainer(path)
        keeper = CheckpointKeeper(checkpoints, tf.train.Checkpoint(**fresh.checkpointed), keep=20)
        assert keeper.restore(step) == step
        assert all_finite(fresh), f"checkpoint {step} holds non-finite values"


def test_non_finite_optimizer_state_is_never_committed_and_the_run_goes_back(
    tmp_path, digits_dataset
):
    path = write_experiment(
        tmp_path,
        digits_dataset,
        training__steps=10,
        training__eval_every_steps=5,
        checkpoint__every_steps=1,
        checkpoint__keep=20,
    )
    trainer = make_trainer(path)
    poisoned = []

    def poison_an_adam_slot(step, loss, results):
        # The next update still reports a finite loss, but leaves NaN weights behind it.
        if not poisoned:
            slot = next(v for v in trainer.optimizer.variables if v.name.startswith("v/"))
            slot.assign(tf.fill(slot.shape, float("nan")))
            poisoned.append(step)

    outcome = run(trainer, on_evaluation=poison_an_adam_slot)

    assert poisoned == [5]
    assert outcome.exit_code == 0 and outcome.step == 10
    assert outcome.restores >= 1
    assert all_finite(trainer)
    messages = events(tmp_path / "run")
    assert any(m.startswith("not finite: ") for m in messages)
    assert any("variables not finite: restored checkpoint 5" in m for m in messages)


def test_weights_that_are_not_finite_are_not_exported(tmp_path):
    model = keras.Sequential([keras.Input((3,), name="x"), keras.layers.Dense(2, name="head")])
    kernel = model.get_layer("head").kernel
    kernel.assign(tf.fill(kernel.shape, float("inf")))
    with pytest.raises(NonFiniteWeightsError, match="head/kernel"):
        save_serving_model(model, tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_a_preemption_inside_a_run_of_skipped_updates_commits_nothing(
    tmp_path, digits_dataset, monkeypatch
):
    import training.controller
    from training.preemption import EXIT_PREEMPTED

    scale_training_batches(monkeypatch, (6, 7), HUGE)  # the updates to steps 7 and 8
    path = write_experiment(
        tmp_path, digits_dataset, training__steps=12, checkpoint__every_steps=1, checkpoint__keep=20
    )
    trainer = make_trainer(path)

    flag = SignalDuringUpdate(trainer, 8)  # once step 7 was skipped
    monkeypatch.setattr(training.controller, "PreemptionFlag", lambda: flag)
    outcome = run(trainer)

    assert outcome.exit_code == EXIT_PREEMPTED and outcome.step == 8
    assert committed_steps(tmp_path / "run" / "checkpoints")[0] == 6
    assert "preempted (SIGTERM); no checkpoint saved (not finite)" in events(tmp_path / "run")
