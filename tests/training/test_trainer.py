"""The Trainer: one compiled update (accumulated or not) and one evaluation pass."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.experiments import make_trainer, run, write_experiment
from training.trainer import evaluation_names, weights_digest


def test_accumulated_micro_batches_make_the_large_batch_update(tmp_path, digits_dataset):
    whole = make_trainer(write_experiment(tmp_path / "whole", digits_dataset, training__steps=3))
    run(whole)
    accumulated = make_trainer(
        write_experiment(
            tmp_path / "accumulated",
            digits_dataset,
            training__steps=3,
            training__gradient_accumulation=4,
        )
    )
    run(accumulated)

    for a, b in zip(whole.model.get_weights(), accumulated.model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not np.allclose(whole.model.get_weights()[0], 0)


def test_an_execution_reports_the_mean_loss_of_its_updates(tmp_path, digits_dataset):
    trainer = make_trainer(write_experiment(tmp_path / "a", digits_dataset, training__steps=6))
    twin = make_trainer(write_experiment(tmp_path / "b", digits_dataset, training__steps=6))
    losses = [twin.train(1, stop_requested=False).loss for _ in range(3)]
    execution = trainer.train(3, stop_requested=False)

    assert trainer.step == twin.step == 3
    assert execution.loss == pytest.approx(np.mean(losses), rel=1e-5)
    # One update runs without the in-graph loop, several with it: the same updates.
    assert weights_digest(trainer.model) == weights_digest(twin.model)
    assert not execution.stop_requested
    assert execution.learning_rate == pytest.approx(0.01)


def test_evaluation_reports_the_names_it_promises(tmp_path, digits_dataset):
    trainer = make_trainer(write_experiment(tmp_path, digits_dataset, training__steps=1))
    results = trainer.evaluate("validation")

    assert list(results) == [*evaluation_names(trainer.task), "examples"]
    assert evaluation_names(trainer.task) == ["loss", "label_accuracy"]
    assert results["examples"] == trainer.task.manifest.splits["validation"].num_records
    assert 0.0 <= results["label_accuracy"] <= 1.0
