"""The Controller in this process: the loop, evaluation points, checkpoints, recovery."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from research.experiments import load_experiment
from research.experiments.task import ExperimentTask
from tests.support.experiments import (
    SignalDuringUpdate,
    make_trainer,
    run,
    write_experiment,
)
from training.checkpoints import committed_steps
from training.controller import Controller
from training.errors import TrainingSetupError
from training.run import train


def records(run_dir, kind):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    return [row for row in rows if row["kind"] == kind]


def test_trains_logs_and_evaluates(tmp_path, digits_dataset):
    path = write_experiment(
        tmp_path, digits_dataset, training__steps=60, training__steps_per_execution=4
    )
    outcome = run(make_trainer(path))

    assert outcome.exit_code == 0
    assert outcome.step == 60
    assert outcome.metrics["validation"]["label_accuracy"] > 0.8
    assert set(outcome.metrics) == {"validation", "test"}
    train_rows = records(tmp_path / "run", "train")
    assert train_rows[-1]["step"] == 60
    assert {"loss", "gradient_norm", "learning_rate", "examples_per_second"} <= set(train_rows[0])
    assert train_rows[-1]["loss"] < train_rows[0]["loss"]
    assert records(tmp_path / "run", "validation")
    assert any((tmp_path / "run" / "tensorboard").iterdir())
    assert committed_steps(tmp_path / "run" / "checkpoints")[0] == 60


def test_executions_stop_at_evaluation_points(tmp_path, digits_dataset):
    path = write_experiment(
        tmp_path, digits_dataset, training__steps=12, training__steps_per_execution=5
    )
    reported = []
    trainer = make_trainer(path)
    with Controller(trainer, eval_every_steps=4, progress=False) as controller:
        outcome = controller.train(on_evaluation=lambda *point: reported.append(point))

    assert outcome.step == 12
    train_rows = records(tmp_path / "run", "train")
    validation_rows = records(tmp_path / "run", "validation")
    assert [row["step"] for row in train_rows] == [4, 8, 12]
    assert [row["step"] for row in validation_rows] == [4, 8, 12]
    assert [step for step, _, _ in reported] == [4, 8, 12]
    for (_, loss, results), train_row, validation_row in zip(
        reported, train_rows, validation_rows, strict=True
    ):
        assert loss == pytest.approx(train_row["loss"])  # one execution per evaluation point
        assert results["label_accuracy"] == validation_row["label_accuracy"]


def test_a_run_started_from_another_runs_checkpoint_continues_it_exactly(tmp_path, digits_dataset):
    settings = dict(training__steps=20, checkpoint__every_steps=100, model__dropout=0.2)
    straight = run(
        make_trainer(write_experiment(tmp_path / "straight", digits_dataset, **settings))
    )

    first = write_experiment(tmp_path / "first", digits_dataset, **settings)
    assert run(make_trainer(first), until_step=8).step == 8
    assert committed_steps(tmp_path / "first" / "run" / "checkpoints") == [8]
    second = make_trainer(write_experiment(tmp_path / "second", digits_dataset, **settings))
    start = tmp_path / "first" / "run" / "checkpoints"
    with Controller(second, eval_every_steps=None, progress=False, initialize_from=start) as c:
        continued = c.train()

    assert continued.step == 20
    assert continued.weights_sha256 == straight.weights_sha256
    events = [row["message"] for row in records(tmp_path / "second" / "run", "event")]
    assert f"started from {start} at step 8" in events


def test_setup_errors_come_before_any_step(tmp_path, digits_dataset):
    indivisible = write_experiment(
        tmp_path / "b", digits_dataset, data__batch_size=30, training__gradient_accumulation=4
    )
    with pytest.raises(TrainingSetupError, match="not divisible"):
        train(ExperimentTask(load_experiment(indivisible)), export=False)

    blocker = tmp_path / "c" / "blocker"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a file where a directory should be")
    unwritable = write_experiment(
        tmp_path / "c", digits_dataset, checkpoint__directory=str(blocker / "x")
    )
    with pytest.raises(TrainingSetupError, match="checkpoint.directory: cannot write"):
        train(ExperimentTask(load_experiment(unwritable)), export=False)
    assert blocker.read_text() == "a file where a directory should be"
    assert not (tmp_path / "b" / "run").exists()


def test_a_corrupt_latest_checkpoint_falls_back_to_the_one_before(tmp_path, digits_dataset):
    path = write_experiment(tmp_path, digits_dataset, training__steps=20)
    run(make_trainer(path))
    checkpoints = tmp_path / "run" / "checkpoints"
    assert committed_steps(checkpoints)[:2] == [20, 15]
    data = next(checkpoints.glob("ckpt-20.data-*"))
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))

    longer = write_experiment(tmp_path, digits_dataset, training__steps=25)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = run(make_trainer(longer))
    assert any("ckpt-20" in str(w.message) for w in caught)
    assert outcome.step == 25
    events = [row["message"] for row in records(tmp_path / "run", "event")]
    assert "resumed from checkpoint at step 15" in events


def test_non_finite_losses_are_skipped_then_recovered(tmp_path, digits_dataset, monkeypatch):
    import tensorflow as tf

    original = ExperimentTask.build_inputs
    bad_batches = (6, 7, 8, 9)  # after the checkpoint at step 5

    def poison(index, batch):
        features, labels = batch
        bad = tf.reduce_any(tf.equal(index, bad_batches))
        scale = tf.where(bad, tf.constant(float("inf")), tf.constant(1.0))
        return {name: value * scale for name, value in features.items()}, labels

    def poisoned(self, split, *, training=False, **kwargs):
        dataset = original(self, split, training=training, **kwargs)
        return dataset.enumerate().map(poison) if training else dataset

    monkeypatch.setattr(ExperimentTask, "build_inputs", poisoned)
    path = write_experiment(
        tmp_path,
        digits_dataset,
        training__steps=30,
        training__nonfinite={"max_consecutive": 2, "learning_rate_factor": 0.5},
    )
    trainer = make_trainer(path)
    outcome = run(trainer)

    assert outcome.exit_code == 0
    assert outcome.step == 30
    assert outcome.skipped_updates == 4
    assert outcome.restores == 2
    assert float(trainer.lr_scale.numpy()) == 0.25
    assert all(np.isfinite(w).all() for w in trainer.model.get_weights())
    events = [row["message"] for row in records(tmp_path / "run", "event")]
    assert any("non-finite loss: update skipped" in e for e in events)
    assert sum("restored checkpoint 5" in e for e in events) == 2


@pytest.mark.slow
def test_a_truncated_checkpoint_falls_back_to_a_step_with_weights_and_input_position(
    tmp_path, digits_dataset
):
    settings = dict(training__steps=20, model__dropout=0.2)
    straight = run(
        make_trainer(write_experiment(tmp_path / "straight", digits_dataset, **settings))
    )

    path = write_experiment(tmp_path / "cut", digits_dataset, **settings)
    assert run(make_trainer(path), until_step=12).step == 12
    checkpoints = tmp_path / "cut" / "run" / "checkpoints"
    assert committed_steps(checkpoints)[:2] == [12, 10]
    assert not (checkpoints / "input").exists()  # the position is in the checkpoint itself
    data = next(checkpoints.glob("ckpt-12.data-*"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = run(make_trainer(path))
    assert any("ckpt-12" in str(w.message) for w in caught)
    events = [row["message"] for row in records(tmp_path / "cut" / "run", "event")]
    assert "resumed from checkpoint at step 10" in events
    assert resumed.weights_sha256 == straight.weights_sha256


@pytest.mark.slow
def test_evaluation_points_are_reported_alike_however_often_the_run_is_preempted(
    tmp_path, digits_dataset, monkeypatch
):
    """Preempted at an evaluation point (before evaluating there) and again mid-way to
    the next, the run still reports every point once more on resume, with the same mean
    training loss as a run never interrupted."""
    import training.controller

    settings = dict(training__steps=12, training__steps_per_execution=1)

    def train(directory, stop_at=None):
        trainer = make_trainer(write_experiment(directory, digits_dataset, **settings))
        if stop_at is not None:
            flag = SignalDuringUpdate(trainer, stop_at)
            monkeypatch.setattr(training.controller, "PreemptionFlag", lambda: flag)
        reported = []
        with Controller(trainer, eval_every_steps=4, progress=False) as controller:
            outcome = controller.train(on_evaluation=lambda *point: reported.append(point))
        monkeypatch.undo()
        return outcome, reported

    _, straight = train(tmp_path / "straight")
    interrupted = []
    for stop_at in (4, 6, None):
        outcome, reported = train(tmp_path / "interrupted", stop_at)
        interrupted += reported
        assert outcome.step == (stop_at or 12)

    assert [step for step, _, _ in straight] == [4, 8, 12]
    assert [step for step, _, _ in interrupted] == [4, 8, 12]
    for (_, loss, results), (_, again_loss, again_results) in zip(
        straight, interrupted, strict=True
    ):
        assert again_loss == loss
        assert again_results == results
