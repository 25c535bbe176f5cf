"""Hyper-parameter search in which every trial is a training run like ``slipway train``'s.

keras-tuner does what is framework-neutral: its oracles pick the values (random,
Bayesian, Hyperband) and keep the trial records that let an interrupted search resume.
A trial is the experiment with the trial's values (``research.tuning.space``) and
``training.epochs`` set to the search's ``max_epochs``, built into an ExperimentTask and
trained by the same Trainer and Controller as ``slipway train``, in a run directory of
its own (``search/trial_<id>/execution-<i>``: run log, TensorBoard, checkpoints). It is
evaluated on the evaluation split after every epoch, and each epoch's values go to the
oracle: ``loss`` (the epoch's mean training loss) and ``val_<name>`` for everything the
evaluation reports (``val_loss``, ``val_<head>_<metric>``, and ``val_<head>_loss`` with
several heads).

So a tuned configuration trains identically under ``slipway train``: ``best.yaml`` is
the best trial's experiment — the same values, epochs, seed, precision, learning-rate
schedule and accumulation — and training it makes the same updates and reaches the
validation metrics the trial reported (equal up to float rounding between processes;
bit for bit with ``training.deterministic``).

Hyperband's trials of fewer epochs are the first epochs of that same run: every trial's
schedule spans ``max_epochs``, a trial with a smaller budget stops early, and a trial
that continues an earlier one (``tuner/trial_id``) starts from that trial's last
checkpoint — weights, optimizer state and input position — exactly where it stopped.
With ``executions_per_trial`` > 1, execution ``i`` uses seed ``seed + i`` (execution 0
is the experiment itself) and keras-tuner averages their reports epoch by epoch.

An interrupted search resumes where it stopped: keras-tuner runs the interrupted trial
again and its runs resume from their own latest checkpoints. SIGTERM (or Ctrl-C) saves
the running trial's checkpoint and ends the search with exit code 143.

Output, under ``<run_dir>/tuning`` by default: ``search/`` (keras-tuner's project and
every trial's runs), ``results.json`` and ``best.yaml`` (see ``search_results``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras_tuner
import tf_keras as keras
import yaml

from contracts.atomic_files import write_json_atomically
from contracts.yaml_config import ConfigError
from research.data.input_pipeline import verify_shards
from research.experiments.config import ExperimentConfig, load_experiment
from research.experiments.task import ExperimentTask, ModelFn
from research.tuning.space import SearchSpace, TunerSettings, experiment_with, load_space, set_path
from training.controller import Controller, TrainOutcome
from training.distribution import WorkerRole, choose_strategy
from training.errors import EXIT_DIVERGED, EXIT_OK
from training.precision_probe import choose_for_task
from training.preemption import EXIT_PREEMPTED
from training.run_lock import exclusive_run
from training.search_results import SearchResult, forget_results, write_results
from training.trainer import Trainer, evaluation_names

PROJECT_NAME = "search"
STATE_FILE = "slipway_search.json"
FAILED = keras_tuner.engine.trial.TrialStatus.FAILED
# The search decides how long trials train; a space may not vary it.
_LENGTH_KEYS = ("training.epochs", "training.steps")


class SearchPreempted(keras_tuner.errors.FatalError):
    """A trial was preempted (its checkpoint is saved); the search stops, to be resumed."""


# -- what trials report, and the objective -----------------------------------------------


def reported_names(task: ExperimentTask) -> list[str]:
    """Every value a trial reports after each epoch (see the module documentation)."""
    names = ["loss"]
    if task.config.data.eval_split is not None:
        names += [f"val_{name}" for name in evaluation_names(task)]
    return names


def make_objective(space: SearchSpace, available: Sequence[str]) -> keras_tuner.Objective:
    """The space's objective, which must be a value the experiment's trials report."""
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


# -- the plan ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchPlan:
    """A search checked against its experiment and dataset, ready to run.

    ``raw`` is the experiment's YAML mapping with ``training.epochs`` set to
    ``max_epochs``: what every trial, and ``best.yaml``, trains.
    """

    experiment: Path
    config: ExperimentConfig
    raw: dict[str, Any]
    space: SearchSpace
    settings: TunerSettings
    max_epochs: int
    objective: keras_tuner.Objective


def with_epochs(raw: dict[str, Any], epochs: int) -> dict[str, Any]:
    """The experiment mapping trained for ``epochs`` epochs (``training.steps`` removed)."""
    data = set_path(raw, "training.epochs", epochs)
    data["training"].pop("steps", None)
    return data


def plan_search(
    experiment: str | Path,
    space: str | Path,
    *,
    max_trials: int | None = None,
    model_fn: ModelFn | None = None,
) -> SearchPlan:
    """Check everything that can be checked before a trial runs.

    The space against the experiment schema, the dataset's splits and shard checksums,
    the model's interface, and the objective against the values trials report.
    """
    if max_trials is not None and max_trials < 1:
        raise ValueError(f"max_trials must be at least 1, got {max_trials}")
    experiment = Path(experiment)
    loaded = load_experiment(experiment)
    search_space = load_space(space)
    for key in _LENGTH_KEYS:
        if key in search_space.parameters:
            raise ConfigError(
                f"{search_space.where('parameters', key)}: parameters.{key}: the search sets "
                "how long trials train; set tuner.max_epochs instead"
            )
    raw = yaml.safe_load(experiment.read_text(encoding="utf-8"))
    search_space.check(raw, base_dir=loaded.base_dir)
    settings = search_space.tuner
    if max_trials is not None:
        settings = settings.model_copy(update={"max_trials": max_trials})
    max_epochs = settings.max_epochs or loaded.training.epochs
    if max_epochs is None:
        raise ConfigError(
            f"{search_space.where('tuner', 'max_epochs')}: tuner.max_epochs: required when "
            "the experiment gives training.steps rather than training.epochs"
        )
    raw = with_epochs(raw, max_epochs)
    config = experiment_with(raw, {}, base_dir=loaded.base_dir, source=str(experiment))
    task = ExperimentTask(config, model_fn=model_fn)
    dataset_dir = config.resolve(config.data.dataset)
    for split in (config.data.train_split, config.data.eval_split):
        if split is not None:
            verify_shards(dataset_dir, task.manifest, split, "sha256")
    return SearchPlan(
        experiment=experiment,
        config=config,
        raw=raw,
        space=search_space,
        settings=settings,
        max_epochs=max_epochs,
        objective=make_objective(search_space, reported_names(task)),
    )


# -- the trials ----------------------------------------------------------------------------


class TrialRunner(keras_tuner.engine.base_tuner.BaseTuner):
    """keras-tuner's trial bookkeeping around trials trained by the Controller."""

    def __init__(
        self, plan: SearchPlan, *, model_fn: ModelFn | None, progress: bool, **kwargs: Any
    ) -> None:
        self.plan = plan
        self.model_fn = model_fn
        self.progress = progress
        super().__init__(**kwargs)

    def on_trial_begin(self, trial: keras_tuner.engine.trial.Trial) -> None:
        # keras-tuner saves its own state only when a trial ends; saved now, a search
        # stopped during its first trial resumes that trial too.
        self.save()

    def execution_config(self, trial_id: str, execution: int) -> ExperimentConfig:
        """The experiment as execution ``execution`` of trial ``trial_id`` trains it."""
        values = self.plan.space.decode(self.oracle.get_trial(trial_id).hyperparameters.values)
        config = experiment_with(
            self.plan.raw,
            values,
            base_dir=self.plan.config.base_dir,
            source=f"{self.plan.experiment} (trial {trial_id})",
        )
        run_dir = Path(self.get_trial_dir(trial_id)).resolve() / f"execution-{execution}"
        checkpoint = config.checkpoint.model_copy(update={"directory": None})
        return config.model_copy(
            update={
                "run_dir": str(run_dir),
                "seed": config.seed + execution,
                "checkpoint": checkpoint,
            }
        )

    def run_trial(self, trial: keras_tuner.engine.trial.Trial, *args: Any, **kwargs: Any) -> None:
        """Train every execution of ``trial``; each reports its epochs to the oracle."""
        values = trial.hyperparameters.values
        epochs = values.get("tuner/epochs", self.plan.max_epochs)
        parent = values.get("tuner/trial_id")
        for execution in range(self.plan.settings.executions_per_trial):
            start = None
            if parent is not None:
                start = self.execution_config(parent, execution).checkpoint_path
            outcome = self._train(trial, execution, epochs, start)
            if outcome.exit_code == EXIT_PREEMPTED:
                raise SearchPreempted(
                    f"trial {trial.trial_id} was preempted at step {outcome.step} (checkpoint "
                    "saved); run the same command to resume the search"
                )
            if outcome.exit_code == EXIT_DIVERGED:
                raise keras_tuner.errors.FailedTrialError(
                    f"the loss kept diverging (step {outcome.step}, execution {execution})"
                )
            assert outcome.exit_code == EXIT_OK, outcome

    def _train(
        self, trial: keras_tuner.engine.trial.Trial, execution: int, epochs: int, start: Path | None
    ) -> TrainOutcome:
        keras.backend.clear_session()  # layer names and Keras' seed stream start afresh
        config = self.execution_config(trial.trial_id, execution)
        # The plan verified the shards' checksums once; each trial checks their sizes.
        task = ExperimentTask(config, model_fn=self.model_fn, verify="size")
        role = WorkerRole(index=0, count=1)
        trainer = Trainer(
            task, choose_strategy(role), role, precision=choose_for_task(task).precision
        )
        steps_per_epoch = task.steps_per_epoch

        def report(step: int, train_loss: float, results: dict[str, float]) -> None:
            epoch = step // steps_per_epoch
            if self._reported(trial.trial_id, epoch, execution):
                return  # a resumed run evaluates again what it evaluated before
            values = {f"val_{name}": value for name, value in results.items()}
            values.pop("val_examples", None)
            self.oracle.update_trial(trial.trial_id, {"loss": train_loss, **values}, step=epoch)

        with Controller(
            trainer,
            eval_every_steps=steps_per_epoch,
            progress=self.progress,
            initialize_from=start,
        ) as controller:
            return controller.train(until_step=epochs * steps_per_epoch, on_evaluation=report)

    def _reported(self, trial_id: str, epoch: int, execution: int) -> bool:
        metrics = self.oracle.get_trial(trial_id).metrics
        if not metrics.exists("loss"):
            return False
        return any(
            observation.step == epoch and len(observation.value) > execution
            for observation in metrics.get_history("loss")
        )


# -- the search ----------------------------------------------------------------------------


def _open_runner(
    plan: SearchPlan,
    output_dir: Path,
    *,
    overwrite: bool,
    model_fn: ModelFn | None,
    progress: bool,
) -> TrialRunner:
    """A new runner, or the stored one of the same experiment and space (resumed)."""
    project_dir = output_dir / PROJECT_NAME
    state = {"experiment": plan.config.config_hash(), "space": plan.space.fingerprint()}
    state_path = project_dir / STATE_FILE
    if overwrite:  # outputs of the search being replaced must not outlive it
        forget_results(output_dir)
    elif project_dir.exists():
        stored = json.loads(state_path.read_text("utf-8")) if state_path.exists() else None
        if stored != state:
            raise ConfigError(
                f"{project_dir}: holds a search of another experiment or search space; "
                "pass --overwrite to replace it or --out to search elsewhere"
            )
    settings, config = plan.settings, plan.config
    seed = config.seed if settings.seed is None else settings.seed
    runner = TrialRunner(
        plan,
        model_fn=model_fn,
        progress=progress,
        oracle=make_oracle(settings, plan.objective, max_epochs=plan.max_epochs, seed=seed),
        directory=str(output_dir),
        project_name=PROJECT_NAME,
        overwrite=overwrite,
    )
    space = runner.oracle.get_space()
    plan.space.declare(space)
    runner.oracle.update_space(space)
    project_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomically(state_path, state)
    return runner


def _too_many_failures(oracle: keras_tuner.Oracle) -> bool:
    """Whether the oracle ended the search because trials kept failing."""
    limit = oracle.max_consecutive_failed_trials
    last = oracle.end_order[-limit:] if limit else []
    return len(last) == limit > 0 and all(oracle.trials[t].status == FAILED for t in last)


def run_search(
    experiment: str | Path,
    space: str | Path,
    *,
    output_dir: str | Path | None = None,
    max_trials: int | None = None,
    overwrite: bool = False,
    verbose: int = 1,
    model_fn: ModelFn | None = None,
) -> SearchResult:
    """Search ``space`` around ``experiment``; write ``results.json`` and ``best.yaml``.

    Nothing is trained or written unless :func:`plan_search` accepts the search. A
    search already in the output directory (default ``<run_dir>/tuning``) is resumed —
    a larger ``max_trials`` extends it — unless ``overwrite``; a search of another
    experiment or space there is refused. If trials keep failing, keras-tuner ends the
    search; the result says so in ``stopped`` and still lists every trial. ``model_fn``
    builds every trial's model, as it would for ``ExperimentTask``.
    """
    plan = plan_search(experiment, space, max_trials=max_trials, model_fn=model_fn)
    output_dir = Path(output_dir) if output_dir is not None else plan.config.run_path / "tuning"
    # Two searches in one directory would share (and overwrite) one oracle and its trials.
    with exclusive_run(output_dir, command="slipway tune"):
        runner = _open_runner(
            plan, output_dir, overwrite=overwrite, model_fn=model_fn, progress=bool(verbose)
        )
        stopped, preempted = None, False
        try:
            runner.search(verbose=verbose)
        except SearchPreempted as exc:
            stopped, preempted = str(exc), True
        except RuntimeError as exc:
            if not _too_many_failures(runner.oracle):
                raise
            stopped = str(exc).splitlines()[0]
        return write_results(plan, runner.oracle, output_dir, stopped=stopped, preempted=preempted)
