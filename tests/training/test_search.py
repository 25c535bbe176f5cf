"""Hyper-parameter search: real searches on a tiny dataset, every trial a training run."""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from rich.console import Console

from contracts.dataset_manifest import load_manifest
from contracts.yaml_config import ConfigError
from research.data.pipeline import build_dataset
from research.data.spec import load_spec
from research.experiments import load_experiment
from research.experiments.task import ExperimentTask
from tests.support.cli import slipway
from tests.support.training_processes import wait_for_step
from tests.support.tuning_files import EXPERIMENT, MLP, SPACE, write
from training import cli
from training.checkpoints import committed_steps
from training.launcher import HEARTBEAT_ENV
from training.run_lock import RunInUseError, exclusive_run
from training.search import PROJECT_NAME, plan_search, reported_names, run_search
from training.search_results import best_experiment


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An experiment directory with a tiny 3-class 8x8 image dataset built by the pipeline."""
    root = tmp_path_factory.mktemp("tuning")
    rng = np.random.default_rng(0)
    labels = np.arange(96) % 3
    images = (rng.random((96, 8, 8)) * 80 + labels[:, None, None] * 80).astype(np.uint8)
    np.savez(root / "raw.npz", images=images, target=labels)
    spec = write(
        root / "tiny.yaml",
        "name: tiny\n"
        "sources:\n"
        "  - {type: npz, path: raw.npz, arrays: {images: image, target: label}, images: [image]}\n"
        "schema:\n"
        "  image: {type: image, height: 8, width: 8, channels: 1}\n"
        "  label: {type: categorical}\n"
        "labels: [label]\n"
        "split: {ratios: {train: 0.75, validation: 0.25}, seed: s}\n"
        "output: {num_shards: 1}\n",
    )
    build_dataset(load_spec(spec), root / "experiments" / "data" / "tiny")
    write(root / "experiments" / "tiny_cnn.yaml", EXPERIMENT)
    # the quickest model to trace, for the searches that only exercise the tuners
    mlp = EXPERIMENT.replace("{type: cnn, stem_filters: 4, stages: [4], dropout: 0.1}", MLP)
    write(root / "experiments" / "tiny_mlp.yaml", mlp.replace("tiny-cnn", "tiny-mlp"))
    return root / "experiments"


def test_trials_report_the_training_loss_and_every_evaluation_value(project: Path) -> None:
    task = ExperimentTask(load_experiment(project / "tiny_cnn.yaml"))
    assert reported_names(task) == ["loss", "val_loss", "val_label_accuracy"]


# -- checks before any trial -------------------------------------------------------------


def test_an_objective_the_model_does_not_report_fails_before_any_trial(
    project: Path, tmp_path: Path
) -> None:
    space = write(tmp_path / "space.yaml", SPACE.replace("val_label_accuracy", "val_acc"))
    with pytest.raises(ConfigError) as error:
        run_search(project / "tiny_cnn.yaml", space, output_dir=tmp_path / "out")
    assert str(error.value).startswith(f"{space}:1: tuner.objective: ")
    assert "'val_acc'" in str(error.value) and "val_label_accuracy" in str(error.value)
    assert not (tmp_path / "out").exists()


def test_a_missing_eval_split_or_epoch_count_fails_before_any_trial(
    project: Path, tmp_path: Path
) -> None:
    experiment = write(project / "steps.yaml", EXPERIMENT.replace("epochs: 3", "steps: 10"))
    space = write(tmp_path / "space.yaml", SPACE.replace("max_epochs: 1, ", ""))
    with pytest.raises(ConfigError, match=rf"^{space}:1: tuner\.max_epochs: required"):
        plan_search(experiment, space)
    experiment = write(
        project / "dev_split.yaml", EXPERIMENT.replace("batch_size: 16", "eval_split: dev")
    )
    with pytest.raises(ConfigError, match=r"data\.eval_split: the dataset has no split 'dev'"):
        plan_search(experiment, write(tmp_path / "space.yaml", SPACE))


# -- real searches -----------------------------------------------------------------------


def tune(*argv: str | Path) -> int:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["tune", *map(str, argv)])
    return args.handler(args)


@pytest.fixture(scope="module")
def random_search(project: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``slipway tune`` with the random tuner: 2 trials of 1 epoch, its output captured."""
    space = write(tmp_path_factory.mktemp("space") / "space.yaml", SPACE)
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "console", Console(file=printed, width=200))
        code = tune(project / "tiny_cnn.yaml", "--space", space, "--overwrite")
    out = project / "runs" / "tiny-cnn" / "tuning"
    return {"code": code, "space": space, "out": out, "printed": printed.getvalue()}


def test_random_search_reports_every_trial_and_the_best(random_search: dict) -> None:
    assert random_search["code"] == 0
    results = json.loads((random_search["out"] / "results.json").read_text())
    trials = results["trials"]
    assert [t["trial_id"] for t in trials] == ["0", "1"]
    assert all(t["status"] == "COMPLETED" and t["epochs"] == 1 for t in trials)
    for trial in trials:
        assert trial["score"] == trial["metrics"]["val_label_accuracy"]
        assert set(trial["parameters"]) == {
            "training.optimizer.learning_rate", "model.dropout", "model.stem_filters",
            "model.stages",
        }  # fmt: skip
        assert 1e-3 <= trial["parameters"]["training.optimizer.learning_rate"] <= 3e-2
        assert trial["parameters"]["model.stem_filters"] in (4, 8)
        assert trial["parameters"]["model.stages"] in ([4], [4, 8])
    assert trials[0]["parameters"] != trials[1]["parameters"]
    best = max(trials, key=lambda t: t["score"])
    assert results["best_trial"] == best["trial_id"]
    assert results["objective"] == "val_label_accuracy" and results["direction"] == "max"

    printed = random_search["printed"]
    assert "random search: val_label_accuracy" in printed
    assert f"{best['trial_id']} ★" in printed
    rows = [line for line in printed.splitlines() if "completed" in line]
    assert len(rows) == 2
    for trial, row in zip(trials, rows, strict=True):
        assert (
            f"{trial['score']:.4g}" in row
            and json.dumps(trial["parameters"]["model.stages"]) in row
        )


def test_best_yaml_is_the_best_trial_as_a_runnable_experiment(
    random_search: dict, project: Path
) -> None:
    out = random_search["out"]
    results = json.loads((out / "results.json").read_text())
    best = next(t for t in results["trials"] if t["trial_id"] == results["best_trial"])
    assert results["best_config"] == str(out / "best.yaml")

    config = load_experiment(out / "best.yaml")
    values = best["parameters"]
    assert config.training.optimizer.learning_rate == values["training.optimizer.learning_rate"]
    assert config.model.root.dropout == values["model.dropout"]
    assert config.model.root.stem_filters == values["model.stem_filters"]
    assert config.model.root.stages == values["model.stages"]
    original = load_experiment(project / "tiny_cnn.yaml")
    assert config.training.epochs == 1  # what the trials trained (tuner.max_epochs)
    assert config.training.optimizer.weight_decay == original.training.optimizer.weight_decay
    # the same dataset and model root from the new place; a fresh run directory
    assert config.resolve(config.data.dataset).resolve() == (project / "data" / "tiny").resolve()
    assert config.resolve(config.export.model_root).resolve() == (project / "models").resolve()
    assert config.run_path.parent.resolve() == out.resolve()
    assert config.run_path.name.startswith("best-run-")


def test_best_yaml_trained_by_slipway_train_reaches_the_best_trials_metrics(
    random_search: dict,
) -> None:
    out = random_search["out"]
    results = json.loads((out / "results.json").read_text())
    best = next(t for t in results["trials"] if t["trial_id"] == results["best_trial"])

    assert slipway("train", out / "best.yaml", "--no-export") == 0
    task = ExperimentTask(load_experiment(out / "best.yaml"))
    log = [json.loads(line) for line in (task.config.run_path / "metrics.jsonl").open()]
    final = [row for row in log if row["kind"] == "validation"][-1]
    assert final["step"] == task.steps_per_epoch * best["epochs"]  # the same number of steps
    assert final["loss"] == pytest.approx(best["metrics"]["val_loss"], rel=1e-5)
    assert final["label_accuracy"] == pytest.approx(best["metrics"]["val_label_accuracy"], abs=1e-6)


def test_a_space_may_not_vary_how_long_trials_train(project: Path, tmp_path: Path) -> None:
    space = write(
        tmp_path / "space.yaml",
        "tuner: {max_epochs: 2}\nparameters:\n  training.epochs: {type: int, min: 1, max: 3}\n",
    )
    with pytest.raises(ConfigError, match=rf"^{space}:3: parameters\.training\.epochs: "):
        plan_search(project / "tiny_mlp.yaml", space)


def test_best_experiments_get_a_run_directory_of_their_own(tmp_path: Path) -> None:
    raw = yaml.safe_load(EXPERIMENT)
    raw["checkpoint"] = {"directory": "ckpt", "keep": 2}

    def best(values: dict) -> dict:
        return best_experiment(raw, values, base_dir=tmp_path, directory=tmp_path / "out")

    first = best({"model.dropout": 0.2})
    assert first["run_dir"] == best({"model.dropout": 0.2})["run_dir"]  # same experiment
    assert first["run_dir"] != best({"model.dropout": 0.25})["run_dir"]
    assert first["run_dir"].startswith("best-run-")
    assert first["checkpoint"] == {"keep": 2}  # checkpoints go under the new run directory
    assert (
        first["data"]["dataset"] == "../data/tiny" and first["export"]["model_root"] == "../models"
    )
    assert raw["checkpoint"] == {"directory": "ckpt", "keep": 2}


def test_a_finished_search_resumes_without_rerunning_and_refuses_another_space(
    random_search: dict, project: Path, tmp_path: Path
) -> None:
    out = random_search["out"]
    before = json.loads((out / "results.json").read_text())["trials"]
    result = run_search(project / "tiny_cnn.yaml", random_search["space"], verbose=0)
    assert [t.to_json() for t in result.trials] == before  # nothing ran again

    other = write(tmp_path / "other.yaml", SPACE.replace("max: 0.3", "max: 0.2"))
    with pytest.raises(ConfigError, match=rf"{out / PROJECT_NAME}: holds a search of another"):
        run_search(project / "tiny_cnn.yaml", other, verbose=0)
    assert json.loads((out / "results.json").read_text())["trials"] == before


def test_a_second_search_into_the_same_directory_is_refused_while_one_runs(
    random_search: dict, project: Path
) -> None:
    out = random_search["out"]
    before = (out / "results.json").read_text()
    refused = pytest.raises(RunInUseError, match=rf"^{out}: another slipway tune is running")
    with exclusive_run(out, command="slipway tune"), refused:  # as a live search holds it
        run_search(project / "tiny_cnn.yaml", random_search["space"], verbose=0)
    assert (out / "results.json").read_text() == before


def test_trials_that_keep_failing_end_the_search_with_their_messages(
    project: Path, tmp_path: Path
) -> None:
    # every value passes the schema, but the dataset has no such label: each trial fails
    space = write(
        tmp_path / "space.yaml",
        "tuner: {max_trials: 5, max_epochs: 1}\n"
        "parameters:\n  data.labels: {type: choice, values: [[a], [b], [c], [d]]}\n",
    )
    assert tune(project / "tiny_cnn.yaml", "--space", space, "--out", tmp_path / "out") == 1
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["best_trial"] is None and results["best_config"] is None
    assert "consecutive failures" in results["stopped"]
    assert [t["status"] for t in results["trials"]] == ["FAILED"] * 3
    assert all("not labels of the dataset" in t["message"] for t in results["trials"])
    assert not (tmp_path / "out" / "best.yaml").exists()


def test_hyperband_continues_the_best_trial_from_its_checkpoint(
    project: Path, tmp_path: Path
) -> None:
    space = write(
        tmp_path / "space.yaml",
        "tuner: {type: hyperband, max_trials: 3, max_epochs: 2, factor: 2, objective: val_loss}\n"
        "parameters:\n"
        "  training.optimizer.learning_rate: {type: log_uniform, min: 1.0e-3, max: 3.0e-2}\n",
    )
    result = run_search(project / "tiny_mlp.yaml", space, output_dir=tmp_path / "out", verbose=0)
    assert [t.status for t in result.trials] == ["COMPLETED"] * 3
    assert [t.epochs for t in result.trials] == [1, 1, 2]
    first_round = min(result.trials[:2], key=lambda t: t.score)
    continued = result.trials[2]
    assert continued.values == first_round.values
    stored = json.loads((tmp_path / "out" / PROJECT_NAME / "trial_2" / "trial.json").read_text())[
        "hyperparameters"
    ]["values"]
    assert stored["tuner/trial_id"] == first_round.trial_id and stored["tuner/initial_epoch"] == 1
    # it continued from that trial's last checkpoint, optimizer state included
    batches = math.ceil(load_manifest(project / "data" / "tiny").splits["train"].num_records / 16)
    runs = tmp_path / "out" / PROJECT_NAME
    parent = runs / f"trial_{first_round.trial_id}" / "execution-0"
    child = runs / f"trial_{continued.trial_id}" / "execution-0"
    assert committed_steps(parent / "checkpoints")[0] == batches
    assert committed_steps(child / "checkpoints")[0] == 2 * batches
    events = [json.loads(line) for line in (child / "metrics.jsonl").open()]
    started = f"started from {parent / 'checkpoints'} at step {batches}"
    assert started in [event.get("message") for event in events]
    assert [e["step"] for e in events if e["kind"] == "validation"] == [2 * batches]
    assert result.direction == "min"
    assert result.best is min(result.trials, key=lambda t: t.score)


def test_bayesian_search_runs_its_model_guided_trial(project: Path, tmp_path: Path) -> None:
    space = write(
        tmp_path / "space.yaml",
        "tuner: {type: bayesian, max_trials: 2, max_epochs: 1, initial_points: 1, seed: 4}\n"
        "parameters:\n"
        "  training.optimizer.learning_rate: {type: log_uniform, min: 1.0e-3, max: 3.0e-2}\n"
        "  data.batch_size: {type: choice, values: [16, 32]}\n",
    )
    result = run_search(project / "tiny_mlp.yaml", space, output_dir=tmp_path / "out", verbose=0)
    assert [t.status for t in result.trials] == ["COMPLETED"] * 2
    assert result.trials[0].values != result.trials[1].values
    assert all(t.values["data.batch_size"] in (16, 32) for t in result.trials)
    assert result.best is min(result.trials, key=lambda t: t.score)
    best = load_experiment(result.best_config_path)
    assert best.data.batch_size == result.best.values["data.batch_size"]


@pytest.mark.process
def test_a_preempted_search_resumes_its_trial_from_the_checkpoint(
    project: Path, tmp_path: Path
) -> None:
    space = write(
        tmp_path / "space.yaml",
        "tuner: {type: random, max_trials: 1, max_epochs: 40, objective: val_loss}\n"
        "parameters:\n"
        "  training.optimizer.learning_rate: {type: log_uniform, min: 1.0e-3, max: 3.0e-2}\n",
    )
    out = tmp_path / "out"
    command = [sys.executable, "-m", "slipway", "tune", str(project / "tiny_mlp.yaml")]
    command += ["--space", str(space), "--out", str(out)]
    heartbeat = tmp_path / "heartbeat"
    first = subprocess.Popen(
        command,
        env={**os.environ, HEARTBEAT_ENV: str(heartbeat)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_for_step(heartbeat, first, 12)
    first.send_signal(signal.SIGTERM)
    output, _ = first.communicate(timeout=300)

    assert first.returncode == 143, output
    assert "search stopped" in output and "preempted" in output
    run = out / PROJECT_NAME / "trial_0" / "execution-0"
    saved = committed_steps(run / "checkpoints")[0]
    assert 12 <= saved < 200

    again = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)

    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    events = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert f"resumed from checkpoint at step {saved}" in [e.get("message") for e in events]
    results = json.loads((out / "results.json").read_text())
    assert [t["status"] for t in results["trials"]] == ["COMPLETED"]
    trial = json.loads((out / PROJECT_NAME / "trial_0" / "trial.json").read_text())
    history = trial["metrics"]["metrics"]["val_loss"]["observations"]
    assert [o["step"] for o in history] == list(range(1, 41))  # every epoch, each once
    assert all(len(o["value"]) == 1 for o in history)
