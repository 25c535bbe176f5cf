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


def test_a_held_out_loss_that_is_not_finite_is_published_as_null_with_its_reason(
    tmp_path, monkeypatch, capsys
):
    """Held-out labels far out of float32's range square to infinity (the model is fine):
    the run publishes, and ``slipway.json``, ``metrics.jsonl`` and the screen say which
    figures are not finite."""
    from contracts.features import FeatureSpec
    from tests.support.cli import slipway
    from tests.support.records import write_dataset

    rng = np.random.default_rng(0)
    rows = [
        {"x": rng.normal(size=3).tolist(), "y": float(rng.normal(10.0, 2.0))} for _ in range(48)
    ]
    features = [FeatureSpec("x", "numeric", shape=(3,)), FeatureSpec("y", "numeric", is_label=True)]
    splits = {"train": [rows[:32]], "validation": [rows[32:40]], "test": [rows[40:]]}
    write_dataset(tmp_path / "dataset", features, splits, labels=["y"])

    original = ExperimentTask.build_inputs

    def out_of_range(self, split, *, training=False, **kwargs):
        data = original(self, split, training=training, **kwargs)
        if training:
            return data
        return data.map(lambda features, labels: (features, {"y": labels["y"] * 1e30}))

    monkeypatch.setattr(ExperimentTask, "build_inputs", out_of_range)
    path = write_experiment(tmp_path, tmp_path / "dataset", training__steps=2, data__batch_size=8)
    assert slipway("train", path, "--quiet") == 0

    (version,) = (tmp_path / "models" / "mlp").iterdir()
    metrics = json.loads((version / "slipway.json").read_text())["metrics"]
    assert metrics["test"]["loss"] is None and metrics["test"]["examples"] == 8
    assert metrics["test"]["y_mae"] > 1e29  # large, and finite: kept
    assert metrics["non_finite"]["test.loss"] == "inf"
    assert metrics["non_finite"]["validation.loss"] == "inf"
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    held_out = [row for row in rows if row["kind"] not in ("train", "event")]
    assert held_out and all(row["loss"] is None for row in held_out)
    assert all(row["non_finite"]["loss"] == "inf" for row in held_out)
    out = capsys.readouterr().out
    assert "loss=inf (not finite)" in out
    assert "recorded as null under metrics.non_finite" in out
