"""``slipway train``, ``slipway export`` and ``slipway tune``.

Registering the commands imports argparse and the TensorFlow-free error types only; a
handler validates the experiment file first and loads TensorFlow after, so a missing
or broken file is reported at once.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from training import errors

if TYPE_CHECKING:
    from research.experiments.config import ExperimentConfig

# What ``slipway`` prints as one line (exit 2) instead of a traceback.
USER_ERRORS = errors.USER_ERRORS

console = Console()

TRAIN_DESCRIPTION = """\
Train an experiment: checkpoints, resume, evaluation, and a new model version in the
experiment's model repository. Running the same command again after a crash or a
preemption resumes from the latest committed checkpoint; after a run that finished and
published, it says so and names the version (--publish-again publishes it once more).

exit codes:
  0    trained (and published)
  1    a group of workers gave up after its restarts
  2    the experiment is invalid (or was changed after its checkpoints were written),
       or another run is training in its run or checkpoint directory; nothing was trained or overwritten
  3    the loss kept diverging
  143  preempted; a checkpoint was saved, run the same command to resume
"""

EXPORT_DESCRIPTION = """\
Publish the weights of an experiment's latest committed checkpoint as a new version in
its model repository, with their results on the evaluation and test splits.

exit codes:
  0    published
  2    the experiment is invalid or has no committed checkpoint
  3    the checkpoint's weights are not finite; nothing was published
"""

TUNE_DESCRIPTION = """\
Search an experiment's hyper-parameters with keras-tuner (random, Bayesian or
Hyperband). Every trial trains the experiment with the trial's values exactly as
`slipway train` would, so best.yaml trains the best trial again. Writes results.json, a
table of every trial, and best.yaml; rerunning the command resumes an interrupted
search.

exit codes:
  0    a best trial was found (best.yaml written)
  1    no trial completed
  2    the experiment, the space or the dataset is invalid; nothing was trained
  143  preempted; run the same command to resume the search
"""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser(
        "train",
        help="train an experiment: checkpoints, resume, evaluation, export",
        description=TRAIN_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("experiment", type=Path, help="experiment YAML")
    group = train.add_mutually_exclusive_group()
    group.add_argument(
        "--workers", type=_positive, default=1, help="launch N local workers under a supervisor"
    )
    group.add_argument(
        "--worker",
        action="store_true",
        help="run as one worker of the cluster TF_CONFIG describes (used by launchers)",
    )
    train.add_argument(
        "--max-restarts", type=int, default=3, help="restarts of a group of workers (N>1)"
    )
    train.add_argument("--no-export", action="store_true", help="skip publishing the model")
    train.add_argument(
        "--publish-again",
        action="store_true",
        help="publish a finished run that was published already (as a new version)",
    )
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(handler=run_train)

    export = subparsers.add_parser(
        "export",
        help="publish a model version from an experiment's latest checkpoint",
        description=EXPORT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    export.add_argument("experiment", type=Path, help="experiment YAML")
    export.set_defaults(handler=run_export)

    tune = subparsers.add_parser(
        "tune",
        help="search an experiment's hyper-parameters (keras-tuner)",
        description=TUNE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tune.add_argument("experiment", type=Path, help="experiment YAML")
    tune.add_argument("--space", type=Path, required=True, help="search space YAML")
    tune.add_argument("--out", type=Path, help="output directory (default: <run_dir>/tuning)")
    tune.add_argument("--max-trials", type=_positive, help="override tuner.max_trials")
    tune.add_argument(
        "--overwrite",
        action="store_true",
        help="discard an earlier search in the output directory instead of resuming it",
    )
    tune.set_defaults(handler=run_tune)


def load_checked_experiment(path: Path) -> ExperimentConfig:
    """The experiment, checked against its dataset's manifest (splits with records, the
    model's inputs and heads) before TensorFlow loads, so these mistakes are reported at
    once."""
    from research.experiments import load_experiment
    from research.experiments.model_io import model_io, open_manifest

    config = load_experiment(path)
    model_io(config, open_manifest(config))
    return config


def run_train(args: argparse.Namespace) -> int:
    config = load_checked_experiment(args.experiment)
    from research.experiments.task import ExperimentTask
    from training.run import train

    outcome = train(
        ExperimentTask(config),
        workers=args.workers,
        export=not args.no_export,
        progress=not args.quiet,
        max_restarts=args.max_restarts,
        publish_again=args.publish_again,
    )
    return outcome.exit_code


def run_export(args: argparse.Namespace) -> int:
    config = load_checked_experiment(args.experiment)
    from research.experiments.task import ExperimentTask
    from training.export import NonFiniteWeightsError
    from training.run import export_latest

    try:
        version, path = export_latest(ExperimentTask(config))
    except NonFiniteWeightsError as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        return errors.EXIT_DIVERGED
    console.print(f"published version {version}: {path}", soft_wrap=True)
    return 0


def run_tune(args: argparse.Namespace) -> int:
    from research.tuning.space import load_space

    # Broken files are reported before TensorFlow loads.
    load_checked_experiment(args.experiment)
    load_space(args.space)
    from training.search import run_search
    from training.search_results import results_table

    result = run_search(
        args.experiment,
        args.space,
        output_dir=args.out,
        max_trials=args.max_trials,
        overwrite=args.overwrite,
    )
    console.print(results_table(result))
    if result.stopped:
        console.print(f"[yellow]search stopped:[/] {escape(result.stopped)}")
    console.print(f"results: {result.results_path}")
    if result.exit_code:
        return result.exit_code
    console.print(f"best experiment: [bold]{result.best_config_path}[/]")
    return 0
