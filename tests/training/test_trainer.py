"""The trainer in this process: learning, accumulation, setup errors, recovery."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from research.configs import ConfigError
from research.experiments import load_experiment
from tests.training.experiments import build_digits_dataset, write_experiment
from training.checkpoints import committed_steps
from training.errors import TrainingSetupError
from training.trainer import Trainer


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return build_digits_dataset(tmp_path_factory.mktemp("digits"))


def train(path):
    trainer = Trainer(load_experiment(path), verbose=False)
    return trainer, trainer.run()


def test_trains_logs_and_evaluates(tmp_path, dataset):
    path = write_experiment(tmp_path, dataset, training__steps=60, training__steps_per_execution=4)
    trainer, outcome = train(path)

    assert outcome.exit_code == 0
    assert outcome.step == 60
    assert outcome.metrics["validation"]["label_accuracy"] > 0.8
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    train_rows = [row for row in rows if row["kind"] == "train"]
    assert train_rows[-1]["step"] == 60
    assert {"loss", "gradient_norm", "learning_rate", "examples_per_second"} <= set(train_rows[0])
    assert train_rows[-1]["loss"] < train_rows[0]["loss"]
    assert any(row["kind"] == "validation" for row in rows)
    assert any((tmp_path / "run" / "tensorboard").iterdir())
    assert committed_steps(tmp_path / "run" / "checkpoints")[0] == 60


def test_accumulated_micro_batches_make_the_large_batch_update(tmp_path, dataset):
    whole = write_experiment(tmp_path / "whole", dataset, training__steps=3)
    accumulated = write_experiment(
        tmp_path / "accumulated", dataset, training__steps=3, training__gradient_accumulation=4
    )
    first, _ = train(whole)
    second, _ = train(accumulated)

    for a, b in zip(first.model.get_weights(), second.model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not np.allclose(first.model.get_weights()[0], 0)


def test_setup_errors_come_before_any_step(tmp_path, dataset):
    bad_feature = write_experiment(tmp_path / "a", dataset, data__features=["pixel"])
    with pytest.raises(
        ConfigError, match=r"data.features: not input features of the dataset: \['pixel'\]"
    ):
        Trainer(load_experiment(bad_feature))

    indivisible = write_experiment(
        tmp_path / "b", dataset, data__batch_size=30, training__gradient_accumulation=4
    )
    with pytest.raises(TrainingSetupError, match="not divisible"):
        Trainer(load_experiment(indivisible))

    blocker = tmp_path / "c" / "blocker"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a file where a directory should be")
    unwritable = write_experiment(tmp_path / "c", dataset, checkpoint__directory=str(blocker / "x"))
    with pytest.raises(TrainingSetupError, match="checkpoint.directory: cannot write"):
        Trainer(load_experiment(unwritable))
    assert blocker.read_text() == "a file where a directory should be"


def test_a_corrupt_latest_checkpoint_falls_back_to_the_one_before(tmp_path, dataset):
    path = write_experiment(tmp_path, dataset, training__steps=20)
    train(path)
    checkpoints = tmp_path / "run" / "checkpoints"
    assert committed_steps(checkpoints)[:2] == [20, 15]
    data = next(checkpoints.glob("ckpt-20.data-*"))
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))

    longer = write_experiment(tmp_path, dataset, training__steps=25)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, outcome = train(longer)
    assert any("ckpt-20" in str(w.message) for w in caught)
    assert outcome.step == 25
    events = [
        json.loads(line)
        for line in (tmp_path / "run" / "metrics.jsonl").open()
        if '"event"' in line
    ]
    assert any(e["message"] == "resumed from checkpoint at step 15" for e in events)


def test_non_finite_losses_are_skipped_then_recovered(tmp_path, dataset, monkeypatch):
    import tensorflow as tf

    from training import data as training_data

    original = training_data.training_dataset
    bad_batches = (6, 7, 8, 9)  # after the checkpoint at step 5

    def poisoned(*args, **kwargs):
        def poison(index, batch):
            features, labels = batch
            bad = tf.reduce_any(tf.equal(index, bad_batches))
            scale = tf.where(bad, tf.constant(float("inf")), tf.constant(1.0))
            return {name: value * scale for name, value in features.items()}, labels

        return original(*args, **kwargs).enumerate().map(poison)

    monkeypatch.setattr(training_data, "training_dataset", poisoned)
    path = write_experiment(
        tmp_path,
        dataset,
        training__steps=30,
        training__nonfinite={"max_consecutive": 2, "learning_rate_factor": 0.5},
    )
    trainer, outcome = train(path)

    assert outcome.exit_code == 0
    assert outcome.step == 30
    assert outcome.skipped_updates == 4
    assert outcome.restores == 2
    assert float(trainer.lr_scale.numpy()) == 0.25
    assert all(np.isfinite(w).all() for w in trainer.model.get_weights())
    events = [
        json.loads(line)["message"]
        for line in (tmp_path / "run" / "metrics.jsonl").open()
        if '"event"' in line
    ]
    assert any("non-finite loss: update skipped" in e for e in events)
    assert sum("restored checkpoint 5" in e for e in events) == 2
