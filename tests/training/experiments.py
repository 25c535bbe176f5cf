"""A small real dataset, experiment files, and the Trainer and Controller run on them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from research.experiments import load_experiment
from research.experiments.task import ExperimentTask
from training.controller import Controller, TrainOutcome
from training.distribution import WorkerRole, choose_strategy
from training.trainer import Trainer

DIGITS_SPEC = """
name: digits-vectors
sources:
  - type: npz
    path: digits.npz
    arrays: {pixels: pixels, target: label}
schema:
  pixels: {type: numeric, dtype: float32, shape: [64]}
  label: {type: categorical}
labels: [label]
dedup:
  exact: {enabled: false}
split:
  ratios: {train: 0.8, validation: 0.1, test: 0.1}
output:
  num_shards: {train: 2, validation: 1, test: 1}
"""

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


def build_digits_dataset(directory: Path) -> Path:
    """scikit-learn's digits as 64-value vectors (pixels scaled to [0, 1])."""
    from sklearn.datasets import load_digits

    from research.data.pipeline import build_dataset
    from research.data.spec import load_spec

    directory.mkdir(parents=True, exist_ok=True)
    digits = load_digits()
    pixels = (digits.data / 16.0).astype(np.float32)
    np.savez(directory / "digits.npz", pixels=pixels, target=digits.target)
    (directory / "spec.yaml").write_text(DIGITS_SPEC)
    build_dataset(load_spec(directory / "spec.yaml"), directory / "dataset")
    return directory / "dataset"


def build_corpus_dataset(
    directory: Path, documents: int, seed: int = 7, vocabulary: int | None = None
) -> Path:
    """The generated text corpus, built with the example spec (``vocabulary``: the
    sentencepiece size asked for instead of the example's)."""
    import yaml

    from research.data.pipeline import build_dataset
    from research.data.spec import load_spec
    from research.data.synthetic import write_corpus_jsonl

    examples = Path(__file__).resolve().parents[2] / "examples"
    directory.mkdir(parents=True, exist_ok=True)
    write_corpus_jsonl(directory / "corpus.jsonl", documents, seed=seed)
    spec = yaml.safe_load((examples / "data" / "corpus.yaml").read_text(encoding="utf-8"))
    if vocabulary is not None:
        spec["vocab"]["size"] = vocabulary
    (directory / "corpus.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    build_dataset(load_spec(directory / "corpus.yaml"), directory / "dataset")
    return directory / "dataset"


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
