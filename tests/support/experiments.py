"""Experiment files, and the Trainer and Controller run on them in the test's process.

Training tests describe a run as overrides of one small experiment (an MLP on the digits
vectors, twenty steps) and train it here, as ``slipway train`` would, without a child
process.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from research.experiments import load_experiment
from research.experiments.task import ExperimentTask
from training.controller import Controller, TrainOutcome
from training.distribution import WorkerRole, choose_strategy
from training.trainer import Trainer

BASE_EXPERIMENT: dict[str, Any] = {
    "name": "mlp",
    "seed": 3,
    "run_dir": "run",
    "data": {"dataset": "dataset", "batch_size": 32, "shuffle_buffer": 256},
    "model": {"type": "mlp", "hidden_units": [32], "dropout": 0.0},
    "training": {
        "steps": 20,
        "precision": "float32",
        "optimizer": {"learning_rate": 0.01, "clip_global_norm": None},
        "schedule": {"decay": "constant"},
    },
    "checkpoint": {"every_steps": 5, "keep": 10},
    "export": {"model_root": "models"},
}


def write_experiment(directory: Path, dataset: Path, **overrides: Any) -> Path:
    """An experiment YAML in ``directory``; ``overrides`` use dotted keys
    (``training__steps=40`` sets training.steps)."""
    config = copy.deepcopy(BASE_EXPERIMENT)
    config["data"]["dataset"] = str(dataset)
    for dotted, value in overrides.items():
        node = config
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "experiment.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def make_trainer(path: Path, **task: Any) -> Trainer:
    """The Trainer of the experiment at ``path`` in this single process."""
    role = WorkerRole(index=0, count=1)
    return Trainer(ExperimentTask(load_experiment(path), **task), choose_strategy(role), role)


def run(trainer: Trainer, **train: Any) -> TrainOutcome:
    """Train as ``slipway train`` does (without publishing); the outcome has the held-out
    results."""
    eval_every = trainer.task.config.training.eval_every_steps
    with Controller(trainer, eval_every_steps=eval_every, progress=False) as controller:
        outcome = controller.train(**train)
        outcome.metrics = controller.evaluate_held_out()
    return outcome


class SignalDuringUpdate:
    """SIGTERM as the controller sees it (a stand-in for its ``PreemptionFlag``),
    arriving during the update to ``step``: the controller passes the flag with the
    execution that starts one step earlier."""

    signal_name = "SIGTERM"

    def __init__(self, trainer: Trainer, step: int) -> None:
        self.trainer, self.step = trainer, step

    def install(self) -> SignalDuringUpdate:
        return self

    def uninstall(self) -> None:
        pass

    @property
    def requested(self) -> bool:
        return self.trainer.step >= self.step - 1
