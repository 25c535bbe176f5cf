"""Running a finished experiment again: nothing is published twice unless asked."""

from __future__ import annotations

import shutil

from contracts.model_repository import existing_versions
from research.experiments import load_experiment
from research.experiments.task import ExperimentTask
from tests.support.experiments import write_experiment
from training.run import train


def test_a_finished_run_points_at_its_version_and_publishes_again_only_when_asked(
    tmp_path, digits_dataset, capsys
):
    path = write_experiment(tmp_path, digits_dataset, training__steps=10)
    models = tmp_path / "models" / "mlp"

    first = train(ExperimentTask(load_experiment(path)), progress=False)
    assert first.exit_code == 0 and first.published == (1, models / "1")
    capsys.readouterr()

    again = train(ExperimentTask(load_experiment(path)), progress=False)
    assert again.exit_code == 0
    assert again.published == (1, models / "1")
    assert again.metrics == first.metrics
    output = " ".join(capsys.readouterr().out.split())
    assert "run complete: mlp trained all 10 steps and was published as version 1" in output
    assert existing_versions(models) == [1]

    forced = train(ExperimentTask(load_experiment(path)), progress=False, publish_again=True)
    assert forced.published == (2, models / "2")
    assert existing_versions(models) == [1, 2]


def test_a_longer_run_or_a_deleted_version_is_not_complete(tmp_path, digits_dataset):
    path = write_experiment(tmp_path, digits_dataset, training__steps=10)
    models = tmp_path / "models" / "mlp"
    train(ExperimentTask(load_experiment(path)), progress=False)

    longer = write_experiment(tmp_path, digits_dataset, training__steps=15)
    outcome = train(ExperimentTask(load_experiment(longer)), progress=False)
    assert outcome.step == 15 and outcome.published == (2, models / "2")

    for version in (1, 2):
        shutil.rmtree(models / str(version))
    outcome = train(ExperimentTask(load_experiment(longer)), progress=False)
    assert outcome.published == (1, models / "1")
