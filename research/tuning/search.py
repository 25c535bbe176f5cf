"""Hyper-parameter search over an experiment, with keras-tuner's oracles.

keras-tuner is written against Keras 3 (``import keras``) while every model here is a
Keras 2 (``tf_keras``) model: its stock ``Tuner.run_trial`` rejects such models and adds
Keras 3 callbacks. So keras-tuner does only what is framework-neutral — its oracles pick
the values (random, Bayesian, Hyperband) and it keeps the project's trial records, which
let an interrupted search resume — and each trial is trained here with tf_keras: build
the zoo model for the trial's experiment, fit it on the experiment's splits, keep the
best epoch's weights (a Hyperband trial continues from them) and report that epoch's
metrics.

Trials train at a constant learning rate in float32: the experiment's schedule and
precision policy belong to the trainer, and a schedule tied to a run's total length
would make Hyperband's short and long trials incomparable.

Output, under ``<run_dir>/tuning`` by default: ``search/`` (keras-tuner's project:
trials and checkpoints), ``results.json`` (every trial) and ``best.yaml`` (the best
trial's experiment, ready for ``slipway train``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras_tuner
import tensorflow as tf
import tf_keras as keras
import yaml

from research.configs import ConfigError
from research.data.input_pipeline import ImageAugmentation, make_dataset, verify_shards
from research.data.manifest import Manifest, load_manifest
from research.experiments.config import ExperimentConfig, load_experiment
from research.experiments.model_io import ModelIO, as_head_labels, model_io
from research.models import build_model, compile_args
from research.models.specs import HeadSpec
from research.tuning.space import SearchSpace, TunerSettings, experiment_with, load_space, set_path

PROJECT_NAME = "search"
STATE_FILE = "slipway_search.json"
RESULTS_FILE = "results.json"
BEST_FILE = "best.yaml"
BEST_RUN_PREFIX = "best-run-"
COMPLETED = keras_tuner.engine.trial.TrialStatus.COMPLETED
FAILED = keras_tuner.engine.trial.TrialStatus.FAILED


# -- the experiment's model inputs and heads ---------------------------------------------


def trial_datasets(
    config: ExperimentConfig, io: ModelIO, manifest: Manifest
) -> tuple[tf.data.Dataset, tf.data.Dataset | None]:
    """One epoch of the train split (shuffled, augmented) and the eval split in order.

    Built per trial, since a trial may change the batch size or the augmentation. Shards
    are only size-checked: :func:`plan_search` verified their SHA-256 once up front.
    Each dataset states its number of batches (from the manifest): tf_keras counts one
    optimizer iteration too many per epoch of a dataset of unknown length.
    """
    data = config.data
    augment = None
    if data.augment is not None:
        augment = ImageAugmentation(
            flip=data.augment.flip,
            crop_padding=data.augment.crop_padding,
            brightness_delta=data.augment.brightness,
        )
    convert = as_head_labels(io)

    def read(split: str, **options: Any) -> tf.data.Dataset:
        batches = math.ceil(manifest.splits[split].num_records / data.batch_size)
        dataset = make_dataset(
            config.resolve(data.dataset),
            split,
            batch_size=data.batch_size,
            sequence_length=data.sequence_length,
            features=list(io.inputs),
            verify="size",
            **options,
        )
        return dataset.map(convert, num_parallel_calls=tf.data.AUTOTUNE).apply(
            tf.data.experimental.assert_cardinality(batches)
        )

    train = read(
        data.train_split,
        shuffle=True,
        seed=config.seed,
        cache=data.cache,
        shuffle_buffer=data.shuffle_buffer,
        augment=augment,
        token_dropout=data.token_dropout,
    )
    return train, None if data.eval_split is None else read(data.eval_split, shuffle=False)


# -- metric names and the objective ------------------------------------------------------


def metric_names(heads: Mapping[str, HeadSpec], *, validation: bool) -> list[str]:
    """Every value a trial reports: ``[val_]loss`` and ``[val_]<head>_<metric>``.

    With several heads, each head's loss is ``[val_]<head>_loss`` too.
    """
    names = ["loss"]
    for head, metrics in compile_args(heads)["metrics"].items():
        if len(heads) > 1:
            names.append(f"{head}_loss")
        names.extend(f"{head}_{metric.name}" for metric in metrics)
    return names + [f"val_{name}" for name in names] if validation else names


def head_named(logs: Mapping[str, Any], heads: Sequence[str]) -> dict[str, float]:
    """Epoch logs under the names :func:`metric_names` promises.

    Keras prefixes a metric with its output's name only when a model has several
    outputs; naming it after its head for a single head too lets ``val_label_accuracy``
    mean the same thing whatever the number of heads.
    """
    values = {key: float(value) for key, value in logs.items()}
    if len(heads) != 1:
        return values
    renamed = {}
    for key, value in values.items():
        prefix = "val_" if key.startswith("val_") else ""
        base = key.removeprefix(prefix)
        renamed[key if base == "loss" else f"{prefix}{heads[0]}_{base}"] = value
    return renamed


def make_objective(space: SearchSpace, available: Sequence[str]) -> keras_tuner.Objective:
    """The space's objective, which must be a value the experiment's model reports."""
    name = space.tuner.objective
    if name not in available:
        raise ConfigError(
            f"{space.where('tuner', 'objective')}: tuner.objective: this experiment's model "
            f"does not report {name!r}; choose one of {', '.join(available)}"
        )
    direction = space.tuner.direction or ("max" if name.endswith("accuracy") else "min")
    return keras_tuner.Objective(name, direction)


def make_oracle(
    settings: TunerSettings, objective: keras_tuner.Objective, *, max_epochs: int, seed: int
) -> keras_tuner.Oracle:
    """The keras-tuner oracle for ``settings.type``, seeded for reproducible choices.

    keras-tuner takes a seed of 0 to mean "draw one at random", so the oracle gets
    ``seed + 1``. Hyperband has no trial limit of its own; ``max_trials`` caps it here.
    """
    common: dict[str, Any] = {"objective": objective, "seed": seed + 1}
    if settings.type == "random":
        return keras_tuner.oracles.RandomSearchOracle(max_trials=settings.max_trials, **common)
    if settings.type == "bayesian":
        return keras_tuner.oracles.BayesianOptimizationOracle(
            max_trials=settings.max_trials, num_initial_points=settings.initial_points, **common
        )
    oracle = keras_tuner.oracles.HyperbandOracle(
        max_epochs=max_epochs, factor=settings.factor, hyperband_iterations=1, **common
    )
    oracle.max_trials = settings.max_trials
    return oracle


# -- the hypermodel and the tuner --------------------------------------------------------


class ExperimentHyperModel(keras_tuner.HyperModel):
    """The experiment with a trial's values applied: its zoo model, compiled and fitted."""

    def __init__(
        self,
        raw: Mapping[str, Any],
        *,
        base_dir: str | Path,
        source: str,
        space: SearchSpace,
        manifest: Manifest,
    ) -> None:
        super().__init__(name=str(raw.get("name", "experiment")))
        self.raw = raw
        self.base_dir = base_dir
        self.source = source
        self.space = space
        self.manifest = manifest

    def declare_hyperparameters(self, hp: keras_tuner.HyperParameters) -> None:
        self.space.declare(hp)

    def experiment(self, hp: keras_tuner.HyperParameters) -> ExperimentConfig:
        return experiment_with(
            self.raw,
            self.space.declare(hp),
            base_dir=self.base_dir,
            source=f"{self.source} (with the trial's values)",
        )

    def build(self, hp: keras_tuner.HyperParameters) -> keras.Model:
        """The zoo model compiled with the heads' losses and AdamW at a constant rate."""
        config = self.experiment(hp)
        io = model_io(config, self.manifest, self.source)
        model = build_model(config.model, io.inputs, io.heads)
        optimizer = config.training.optimizer
        model.compile(
            optimizer=keras.optimizers.AdamW(
                learning_rate=optimizer.learning_rate,
                weight_decay=optimizer.weight_decay,
                beta_1=optimizer.beta_1,
                beta_2=optimizer.beta_2,
                epsilon=optimizer.epsilon,
                global_clipnorm=optimizer.clip_global_norm,
            ),
            steps_per_execution=config.training.steps_per_execution,
            **compile_args(io.heads),
        )
        return model

    def fit(
        self,
        hp: keras_tuner.HyperParameters,
        model: keras.Model,
        *,
        epochs: int,
        initial_epoch: int = 0,
        callbacks: Sequence[keras.callbacks.Callback] = (),
        verbose: int = 0,
    ) -> keras.callbacks.History:
        config = self.experiment(hp)
        io = model_io(config, self.manifest, self.source)
        train, evaluation = trial_datasets(config, io, self.manifest)
        return model.fit(
            train,
            validation_data=evaluation,
            epochs=epochs,
            initial_epoch=initial_epoch,
            callbacks=list(callbacks),
            verbose=verbose,
        )


class BestEpoch(keras.callbacks.Callback):
    """Remembers each fit's best epoch and saves the weights of the best one of all.

    ``logs`` is the current fit's best epoch (head-named, see :func:`head_named`),
    empty until an epoch reports a finite objective.
    """

    def __init__(self, objective: keras_tuner.Objective, path: str) -> None:
        super().__init__()
        self.objective = objective
        self.path = path
        self.best_value: float | None = None
        self.logs: dict[str, float] = {}

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        self.logs = {}

    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        values = head_named(logs or {}, self.model.output_names)
        value = values.get(self.objective.name, math.nan)
        if math.isnan(value):
            return
        if not self.logs or self.objective.better_than(value, self.logs[self.objective.name]):
            self.logs = values
        if self.best_value is None or self.objective.better_than(value, self.best_value):
            self.best_value = value
            self.model.save_weights(self.path)


class TfKerasTuner(keras_tuner.Tuner):
    """keras-tuner's trial bookkeeping around tf_keras training (see the module docstring).

    Execution ``i`` of a trial starts from seed ``seed + i``, so every trial starts from
    the same initial weights for the same architecture and repeated executions differ.
    """

    def __init__(self, *, seed: int, max_epochs: int, **kwargs: Any) -> None:
        self.trial_seed = seed
        self.max_epochs = max_epochs
        super().__init__(**kwargs)

    def _populate_initial_space(self) -> None:
        # keras-tuner's version also builds a model to discover conditional parameters;
        # a search space file has none, so declaring them is enough.
        hp = self.oracle.get_space()
        self.hypermodel.declare_hyperparameters(hp)
        self.oracle.update_space(hp)

    def run_trial(self, trial: keras_tuner.engine.trial.Trial, *, verbose: int = 0) -> list[dict]:
        """Each execution's best-epoch metrics; keras-tuner averages them.

        A Hyperband trial that continues an earlier one (``tuner/trial_id``) starts from
        that trial's best weights and optimizer state.
        """
        hp = trial.hyperparameters
        epochs = hp.values.get("tuner/epochs", self.max_epochs)
        initial_epoch = hp.values.get("tuner/initial_epoch", 0)
        best = BestEpoch(self.oracle.objective, self._get_checkpoint_fname(trial.trial_id))
        results = []
        for execution in range(self.executions_per_trial):
            keras.backend.clear_session()
            keras.utils.set_random_seed(self.trial_seed + execution)
            model = self.hypermodel.build(hp)
            if "tuner/trial_id" in hp.values:
                model.optimizer.build(model.trainable_variables)
                model.load_weights(self._get_checkpoint_fname(hp.values["tuner/trial_id"]))
            self.hypermodel.fit(
                hp,
                model,
                epochs=epochs,
                initial_epoch=initial_epoch,
                callbacks=[best],
                verbose=2 if verbose else 0,
            )
            results.append(best.logs or {self.oracle.objective.name: math.nan})
        return results


# -- results -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialResult:
    trial_id: str
    status: str
    values: dict[str, Any]
    score: float | None
    epochs: int
    metrics: dict[str, float]
    message: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "trial_id": self.trial_id,
            "status": self.status,
            "parameters": self.values,
            "score": _finite(self.score),
            "epochs": self.epochs,
            "metrics": {name: _finite(value) for name, value in self.metrics.items()},
            "message": self.message,
        }


@dataclass(frozen=True)
class SearchResult:
    tuner_type: str
    objective: str
    direction: str
    parameters: list[str]
    trials: list[TrialResult]
    best: TrialResult | None
    output_dir: Path
    results_path: Path
    best_config_path: Path | None
    stopped: str | None = None  # why the search ended before its last trial, if it did


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _trial_result(
    trial: keras_tuner.engine.trial.Trial, space: SearchSpace, max_epochs: int
) -> TrialResult:
    raw = trial.hyperparameters.values
    return TrialResult(
        trial_id=trial.trial_id,
        status=str(trial.status),
        values=space.decode(raw),
        score=None if trial.score is None else float(trial.score),
        epochs=int(raw.get("tuner/epochs", max_epochs)),
        metrics={name: float(trial.metrics.get_last_value(name)) for name in trial.metrics.metrics},
        message=trial.message,
    )


def _atomic_write(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def best_experiment(
    raw: Mapping[str, Any], values: Mapping[str, Any], *, base_dir: str | Path, directory: Path
) -> dict[str, Any]:
    """The experiment mapping with ``values`` applied, to be saved in ``directory``.

    The dataset and model root are rewritten relative to ``directory`` so they name the
    same places from there. The run directory becomes ``best-run-<digest>`` beside the
    file, the digest being the experiment's own (and an explicit checkpoint directory is
    dropped): training it never resumes the checkpoints of the original run, nor those
    of a different best experiment written here by an earlier search.
    """
    tuned = experiment_with(raw, values, base_dir=base_dir, source="best trial")
    data: dict[str, Any] = dict(raw)
    for path, value in values.items():
        data = set_path(data, path, value)
    directory = directory.resolve()
    for key, target in (
        ("data.dataset", tuned.resolve(tuned.data.dataset)),
        ("export.model_root", tuned.resolve(tuned.export.model_root)),
    ):
        data = set_path(data, key, os.path.relpath(target.resolve(), directory))
    checkpoint = data.get("checkpoint")
    if isinstance(checkpoint, dict) and "directory" in checkpoint:
        data["checkpoint"] = {k: v for k, v in checkpoint.items() if k != "directory"}
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    data["run_dir"] = BEST_RUN_PREFIX + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]
    return data


def _too_many_failures(oracle: keras_tuner.Oracle) -> bool:
    """Whether the oracle ended the search because trials kept failing."""
    limit = oracle.max_consecutive_failed_trials
    last = oracle.end_order[-limit:] if limit else []
    return len(last) == limit > 0 and all(oracle.trials[t].status == FAILED for t in last)


# -- the search --------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchPlan:
    """A search checked against its experiment and dataset, ready to run."""

    experiment: Path
    config: ExperimentConfig
    raw: dict[str, Any]
    space: SearchSpace
    settings: TunerSettings
    max_epochs: int
    manifest: Manifest
    objective: keras_tuner.Objective


def plan_search(
    experiment: str | Path, space: str | Path, *, max_trials: int | None = None
) -> SearchPlan:
    """Check everything that can be checked before a trial runs.

    The space against the experiment schema, the dataset's splits and shard checksums,
    and the objective against the metrics the experiment's model reports.
    """
    if max_trials is not None and max_trials < 1:
        raise ValueError(f"max_trials must be at least 1, got {max_trials}")
    experiment = Path(experiment)
    config = load_experiment(experiment)
    raw = yaml.safe_load(experiment.read_text(encoding="utf-8"))
    search_space = load_space(space)
    search_space.check(raw, base_dir=config.base_dir)
    settings = search_space.tuner
    if max_trials is not None:
        settings = settings.model_copy(update={"max_trials": max_trials})
    max_epochs = settings.max_epochs or config.training.epochs
    if max_epochs is None:
        raise ConfigError(
            f"{search_space.where('tuner', 'max_epochs')}: tuner.max_epochs: required when "
            "the experiment gives training.steps rather than training.epochs"
        )
    dataset_dir = config.resolve(config.data.dataset)
    manifest = load_manifest(dataset_dir)
    for key in ("train_split", "eval_split"):
        split = getattr(config.data, key)
        if split is None:
            continue
        if split not in manifest.splits:
            raise ConfigError(
                f"{experiment}: data.{key}: the dataset has no split {split!r} "
                f"(it has {sorted(manifest.splits)})"
            )
        verify_shards(dataset_dir, manifest, split, "sha256")
    io = model_io(config, manifest, str(experiment))
    available = metric_names(io.heads, validation=config.data.eval_split is not None)
    return SearchPlan(
        experiment=experiment,
        config=config,
        raw=raw,
        space=search_space,
        settings=settings,
        max_epochs=max_epochs,
        manifest=manifest,
        objective=make_objective(search_space, available),
    )


def _open_tuner(plan: SearchPlan, output_dir: Path, *, overwrite: bool) -> TfKerasTuner:
    """A new tuner, or the stored one of the same experiment and space (resumed)."""
    project_dir = output_dir / PROJECT_NAME
    state = {"experiment": plan.config.config_hash(), "space": plan.space.fingerprint()}
    state_path = project_dir / STATE_FILE
    if overwrite:  # outputs of the search being replaced must not outlive it
        for name in (RESULTS_FILE, BEST_FILE):
            (output_dir / name).unlink(missing_ok=True)
    elif project_dir.exists():
        stored = json.loads(state_path.read_text("utf-8")) if state_path.exists() else None
        if stored != state:
            raise ConfigError(
                f"{project_dir}: holds a search of another experiment or search space; "
                "pass --overwrite to replace it or --out to search elsewhere"
            )
    settings, config = plan.settings, plan.config
    seed = config.seed if settings.seed is None else settings.seed
    tuner = TfKerasTuner(
        seed=config.seed,
        max_epochs=plan.max_epochs,
        oracle=make_oracle(settings, plan.objective, max_epochs=plan.max_epochs, seed=seed),
        hypermodel=ExperimentHyperModel(
            plan.raw,
            base_dir=config.base_dir,
            source=str(plan.experiment),
            space=plan.space,
            manifest=plan.manifest,
        ),
        directory=str(output_dir),
        project_name=PROJECT_NAME,
        overwrite=overwrite,
        executions_per_trial=settings.executions_per_trial,
    )
    project_dir.mkdir(parents=True, exist_ok=True)
    _atomic_write(state_path, json.dumps(state, indent=2) + "\n")
    return tuner


def run_search(
    experiment: str | Path,
    space: str | Path,
    *,
    output_dir: str | Path | None = None,
    max_trials: int | None = None,
    overwrite: bool = False,
    verbose: int = 1,
) -> SearchResult:
    """Search ``space`` around ``experiment``; write ``results.json`` and ``best.yaml``.

    Nothing is trained or written unless :func:`plan_search` accepts the search. A
    search already in the output directory (default ``<run_dir>/tuning``) is resumed —
    a larger ``max_trials`` extends it — unless ``overwrite``; a search of another
    experiment or space there is refused. If trials keep failing, keras-tuner ends the
    search; the result says so in ``stopped`` and still lists every trial.
    """
    plan = plan_search(experiment, space, max_trials=max_trials)
    output_dir = Path(output_dir) if output_dir is not None else plan.config.run_path / "tuning"
    output_dir.mkdir(parents=True, exist_ok=True)
    if plan.config.training.deterministic:
        tf.config.experimental.enable_op_determinism()
    tuner = _open_tuner(plan, output_dir, overwrite=overwrite)
    stopped = None
    try:
        tuner.search(verbose=verbose)
    except RuntimeError as exc:
        if not _too_many_failures(tuner.oracle):
            raise
        stopped = str(exc).splitlines()[0]
    return _record(plan, tuner.oracle, output_dir, stopped)


def _record(
    plan: SearchPlan, oracle: keras_tuner.Oracle, output_dir: Path, stopped: str | None
) -> SearchResult:
    """Write ``best.yaml`` (when a trial completed) and ``results.json``."""
    trials = [
        _trial_result(oracle.trials[trial_id], plan.space, plan.max_epochs)
        for trial_id in oracle.start_order
    ]
    completed = [t for t in oracle.get_best_trials(1) if t.status == COMPLETED]
    best = next((t for t in trials if completed and t.trial_id == completed[0].trial_id), None)
    best_path = None
    if best is not None:
        best_path = output_dir / BEST_FILE
        data = best_experiment(
            plan.raw, best.values, base_dir=plan.config.base_dir, directory=output_dir
        )
        experiment_with(data, {}, base_dir=output_dir.resolve(), source=str(best_path))
        header = (
            f"# The best of {len(trials)} trials of a {plan.settings.type} search "
            f"(trial {best.trial_id}: {plan.objective.name} = {best.score:.6g})\n"
            f"# of {', '.join(plan.space.parameters)} around {plan.experiment.resolve()}.\n"
            f"# Paths are relative to this file; {data['run_dir']}/ is a new run directory.\n"
        )
        body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
        _atomic_write(best_path, header + body)
    result = SearchResult(
        tuner_type=plan.settings.type,
        objective=plan.objective.name,
        direction=plan.objective.direction,
        parameters=list(plan.space.parameters),
        trials=trials,
        best=best,
        output_dir=output_dir,
        results_path=output_dir / RESULTS_FILE,
        best_config_path=best_path,
        stopped=stopped,
    )
    document = {
        "experiment": str(plan.experiment.resolve()),
        "space": str(Path(plan.space.source).resolve()),
        "tuner": result.tuner_type,
        "objective": result.objective,
        "direction": result.direction,
        "best_trial": best.trial_id if best else None,
        "best_config": str(best_path) if best_path else None,
        "stopped": stopped,
        "trials": [trial.to_json() for trial in trials],
    }
    _atomic_write(result.results_path, json.dumps(document, indent=2) + "\n")
    return result
