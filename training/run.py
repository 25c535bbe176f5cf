"""Training an experiment Task end to end: the entry point ``slipway train`` and scripts share.

A researcher's script::

    from research.experiments import load_experiment
    from research.experiments.task import ExperimentTask
    from training.run import train

    if __name__ == "__main__":
        task = ExperimentTask(load_experiment("experiment.yaml"), model_fn=build)
        outcome = train(task, workers=2)

gets everything ``slipway train experiment.yaml`` gets: checkpoints that a rerun of the
same script resumes bit-for-bit after a crash or a SIGKILL, preemption handling (SIGTERM
saves at the next step boundary and the call returns exit code 143), the experiment's
precision and gradient accumulation, evaluation, and a new version of the model in the
model repository (``export=False`` skips it).

``workers=N`` with N > 1 works spawn-style, like multiprocessing's "spawn" start method.
In the launching process the call becomes a supervisor (restarts on failure, see
``training.supervisor``) that starts N copies of the same command line — the same
interpreter with its original arguments, so ``python script.py`` and ``python -m
package`` both work — each with a ``TF_CONFIG`` naming its place in the group. In each
copy the same ``train`` call finds that it is a worker, trains as that worker, and then
*ends the process* with the worker's exit code: code after ``train`` runs only in the
launching process, which gets an outcome with the group's exit code and the last
committed step (worker logs are under ``<run_dir>/workers``). The script must therefore
reach ``train`` with the same task every time, and be a script: an interactive session
or a notebook cannot be started again as a copy of itself. A process that already has a
``TF_CONFIG`` (a Kubeflow TFJob, ``slipway train --worker``) trains as the worker it
names. Workers die with the supervisor that started them, and a run directory, like a
checkpoint directory, holds one live run at a time (a second ``train`` there fails at
once, see ``training.run_lock``).
A run keeps the precision it started in: precision ``auto`` is resolved once, recorded
in ``<run_dir>/precision.json``, and read back by every resume and every worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import tensorflow as tf
from rich.console import Console
from rich.markup import escape

from contracts.atomic_files import write_json_atomically
from contracts.metric_values import from_json_metrics, json_metrics, non_finite, shown
from contracts.yaml_config import located
from research.experiments.task import ExperimentTask
from research.models.placement import pipeline_stages
from training.checkpoints import latest_committed_step
from training.controller import Controller, TrainOutcome, check_writable
from training.distribution import WorkerRole, choose_strategy, worker_role
from training.errors import (
    EXIT_DIVERGED,
    EXIT_INVALID,
    EXIT_OK,
    USER_ERRORS,
    TrainingSetupError,
)
from training.launcher import PRECISION_ENV, die_with_supervisor
from training.mesh import local_devices, prepare_devices
from training.mesh_trainer import MESH_PRECISION, MeshTrainer
from training.precision import (
    PrecisionChoice,
    record_precision,
    recorded_precision,
    resolve_precision,
)
from training.precision_probe import choose_for_task
from training.run_lock import exclusive_run
from training.supervisor import Supervisor
from training.trainer import Trainer, global_micro_batch_size

console = Console()
# Why the supervisor chose the precision it passes on (PRECISION_ENV), for the run log.
PRECISION_REASON_ENV = "SLIPWAY_PRECISION_REASON"


def train(
    task: ExperimentTask,
    *,
    workers: int = 1,
    export: bool = True,
    progress: bool = True,
    max_restarts: int = 3,
    publish_again: bool = False,
) -> TrainOutcome:
    """Train ``task`` to its last step, evaluate it on the held-out splits and publish it.

    ``progress`` shows a progress bar; ``max_restarts`` bounds how often a supervisor of
    several workers restarts the group after a failure. See the module documentation
    for ``workers``. A run that already finished and published its last step is not
    published a second time (identical weights under a new version number): the call
    says so and returns that version, unless ``publish_again``. A setup error names the
    experiment file and line of the key it refuses.
    """
    with _located_setup_errors(task):
        return _train(task, workers, export, progress, max_restarts, publish_again)


@contextlib.contextmanager
def _located_setup_errors(task: ExperimentTask) -> Iterator[None]:
    try:
        yield
    except TrainingSetupError as exc:
        raise TrainingSetupError(located(str(exc), task.config.source)) from None


def _train(
    task: ExperimentTask,
    workers: int,
    export: bool,
    progress: bool,
    max_restarts: int,
    publish_again: bool,
) -> TrainOutcome:
    if workers < 1:
        raise ValueError(f"workers must be at least 1. Received: workers={workers}")
    # Before anything starts TensorFlow's runtime (the precision probe does), after
    # which a CPU can no longer be split into a mesh's or a pipeline's devices.
    prepare_devices(task.config.distribution)
    if "TF_CONFIG" not in os.environ:
        # This process is the run: it alone may train in the run directory, and into the
        # checkpoint directory, until it ends.
        _check_setup(task, workers)
        with exclusive_run(task.config.run_path, task.config.checkpoint_path):
            finished = None if publish_again or not export else _finished_publication(task)
            if finished is not None:
                _say_complete(task, finished)
                return finished
            precision = _run_precision(task, record=True)
            if workers > 1:
                return _supervise(task, workers, precision, max_restarts=max_restarts)
            return _train_here(task, worker_role(), precision, export=export, progress=progress)
    role = worker_role()
    precision = _worker_precision(task, role)
    if workers == 1:
        return _train_here(task, role, precision, export=export, progress=progress)
    die_with_supervisor()
    try:
        with _located_setup_errors(task):
            outcome = _train_here(task, role, precision, export=export, progress=progress)
    except USER_ERRORS as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(EXIT_INVALID)
    sys.exit(outcome.exit_code)


def export_latest(task: ExperimentTask) -> tuple[int, Path]:
    """Publish the weights of the experiment's latest committed checkpoint, with their
    results on the held-out splits; ``(version, directory)``."""
    role = WorkerRole(index=0, count=1)
    precision = _run_precision(task, record=False).precision
    trainer = Trainer(task, choose_strategy(role), role, precision=precision)
    with Controller(trainer, eval_every_steps=None, progress=False) as controller:
        step = controller.restore()
        if step is None:
            raise TrainingSetupError(
                f"checkpoint.directory: no committed checkpoint in {task.config.checkpoint_path}"
            )
        published = controller.publish(
            controller.evaluate_held_out(), extra={"checkpoint_step": step}
        )
    assert published is not None  # a single process is the chief
    return published


def build_trainer(
    task: ExperimentTask, role: WorkerRole, precision: str | None = None
) -> Trainer | MeshTrainer:
    """The trainer the experiment's distribution asks for: on a DTensor mesh, with its
    blocks in pipeline stages, or replicated by the strategy this process's devices and
    ``TF_CONFIG`` call for."""
    distribution = task.config.distribution
    if distribution.mesh is not None:
        return MeshTrainer(task, role, precision=precision)
    if distribution.pipeline is not None:
        if role.count > 1:
            raise TrainingSetupError(
                "distribution.pipeline places the blocks on this process's devices; "
                f"it cannot be combined with {role.count} workers"
            )
        # One replica whose blocks sit on the stages' devices: the default strategy.
        with pipeline_stages(local_devices(distribution.pipeline.stages)):
            return Trainer(task, tf.distribute.get_strategy(), role, precision=precision)
    return Trainer(task, choose_strategy(role), role, precision=precision)


def _check_setup(task: ExperimentTask, workers: int) -> None:
    """What would fail a run (or every worker of one) before its first step."""
    global_micro_batch_size(task.config, workers)
    check_writable(task.config.checkpoint_path)


def _run_precision(task: ExperimentTask, *, record: bool) -> PrecisionChoice:
    """The precision the run trains in: as configured; for ``auto`` the one recorded at
    the run's first start, or at a first start the probe's choice. With ``record`` (the
    process holding the run's lock) the choice is recorded for every resume and worker."""
    run_dir = task.config.run_path
    if task.config.distribution.mesh is not None and task.config.training.precision == "auto":
        return PrecisionChoice(MESH_PRECISION, "auto: a device mesh trains in float32")
    if task.config.training.precision == "auto":
        recorded = recorded_precision(run_dir)
        if recorded is not None:
            return recorded
    choice = choose_for_task(task)
    if record:
        record_precision(run_dir, choice)
    return choice


def _worker_precision(task: ExperimentTask, role: WorkerRole) -> PrecisionChoice:
    """A worker's precision: the launching supervisor's choice, else the one the run
    recorded, else (a first start under another launcher, whose workers could not agree
    on timings of their own) the safe default, which the chief records."""
    requested = task.config.training.precision
    if requested != "auto":
        return PrecisionChoice(requested, "as configured")
    chosen = os.environ.get(PRECISION_ENV)
    if chosen:
        why = os.environ.get(PRECISION_REASON_ENV) or "auto: chosen by the supervisor"
        return PrecisionChoice(chosen, why)
    recorded = recorded_precision(task.config.run_path)
    if recorded is not None:
        return recorded
    default = PrecisionChoice(
        resolve_precision(requested),
        "auto: the safe default without a probe",
    )
    if role.is_chief:
        record_precision(task.config.run_path, default)
    return default


def _train_here(
    task: ExperimentTask,
    role: WorkerRole,
    precision: PrecisionChoice,
    *,
    export: bool,
    progress: bool,
) -> TrainOutcome:
    _check_setup(task, role.count)
    config = task.config
    trainer = build_trainer(task, role, precision.precision)
    eval_every = config.training.eval_every_steps
    with Controller(trainer, eval_every_steps=eval_every, progress=progress) as controller:
        controller.log.event(trainer.step, precision.describe())
        outcome = controller.train()
        if outcome.exit_code == EXIT_OK:
            outcome.metrics = controller.evaluate_held_out()
            if export:
                outcome.published = controller.publish(outcome.metrics)
    if outcome.published is not None:
        _record_publication(task, outcome)
    if outcome.exit_code == EXIT_OK:
        _report(outcome)
    return outcome


# -- a finished run -------------------------------------------------------------------
def _say_complete(task: ExperimentTask, outcome: TrainOutcome) -> None:
    assert outcome.published is not None
    version, directory = outcome.published
    console.print(
        f"run complete: {task.config.name} trained all {outcome.step} steps and was published "
        f"as version {version}: {directory} (--publish-again publishes it once more)",
        soft_wrap=True,
    )


PUBLISHED_FILE = "published.json"


def _record_publication(task: ExperimentTask, outcome: TrainOutcome) -> None:
    """Remember which version this run's last step became, so a rerun need not repeat it."""
    assert outcome.published is not None
    version, directory = outcome.published
    write_json_atomically(
        task.config.run_path / PUBLISHED_FILE,
        {
            "step": outcome.step,
            "config_hash": task.config.config_hash(),
            "version": version,
            "directory": str(directory),
            "precision": outcome.precision,
            "metrics": json_metrics(outcome.metrics),
        },
    )


def _finished_publication(task: ExperimentTask) -> TrainOutcome | None:
    """The outcome of this run when its last step is committed and already published.

    Only when nothing changed since: the same experiment (config hash), the last step
    still the newest committed checkpoint, and the version still in the repository.
    """
    config = task.config
    try:
        record = json.loads((config.run_path / PUBLISHED_FILE).read_text(encoding="utf-8"))
        version, directory = int(record["version"]), Path(record["directory"])
        step, config_hash = int(record["step"]), record["config_hash"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    last = latest_committed_step(config.checkpoint_path)
    if not (step == task.total_steps == last and config_hash == config.config_hash()):
        return None
    if not directory.is_dir():
        return None
    return TrainOutcome(
        exit_code=EXIT_OK,
        step=step,
        precision=str(record.get("precision", "")),
        metrics=from_json_metrics(record.get("metrics") or {}),
        published=(version, directory),
    )


def _supervise(
    task: ExperimentTask, workers: int, precision: PrecisionChoice, *, max_restarts: int
) -> TrainOutcome:
    """Run this very command line as ``workers`` local workers until they finish."""
    config = task.config
    # orig_argv keeps the interpreter's own options, ``-m package`` among them.
    command = [sys.executable, *sys.orig_argv[1:]]
    console.print(precision.describe(), soft_wrap=True, highlight=False)
    supervisor = Supervisor(
        command,
        workers,
        max_restarts=max_restarts,
        log_dir=config.run_path / "workers",
        env={PRECISION_ENV: precision.precision, PRECISION_REASON_ENV: precision.reason},
        permanent_exit_codes=(EXIT_INVALID, EXIT_DIVERGED),
    )
    code = supervisor.run()
    outcome = TrainOutcome(exit_code=code, step=latest_committed_step(config.checkpoint_path) or 0)
    finished = _finished_publication(task) if code == EXIT_OK else None
    if finished is not None:  # what the chief worker published
        outcome.published = finished.published
    return outcome


def _report(outcome: TrainOutcome) -> None:
    console.print(
        f"trained {outcome.step} steps ({outcome.precision}, "
        f"{outcome.examples_per_second:,.0f} examples/s); weights sha256 {outcome.weights_sha256}",
        soft_wrap=True,
    )
    for split, values in outcome.metrics.items():
        text = ", ".join(f"{k}={shown(v)}" for k, v in values.items() if k != "examples")
        console.print(f"  {split}: {text}", soft_wrap=True)
        unmeasured = [k for k, v in values.items() if non_finite(v) is not None]
        if unmeasured:
            console.print(
                f"  [yellow]warning:[/] {split} {', '.join(unmeasured)} not finite: recorded "
                "as null under metrics.non_finite in slipway.json (a label or input far out "
                "of range, or a diverged model)",
                soft_wrap=True,
            )
    if outcome.published is not None:
        version, directory = outcome.published
        console.print(f"published version {version}: {directory}", soft_wrap=True)
