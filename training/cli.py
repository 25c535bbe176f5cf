"""``slipway train`` and ``slipway export``.

Exit codes: 0 trained (and exported), 1 a multi-worker group gave up after its
restarts, 2 the experiment is invalid (nothing was trained or overwritten), 3 the loss
kept diverging, 143 preempted (a checkpoint was saved; run the same command to resume).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from research.configs import ConfigError
from research.data.manifest import DatasetError
from training.errors import EXIT_DIVERGED, EXIT_INVALID, TrainingSetupError

console = Console()


USER_ERRORS = (ConfigError, DatasetError, TrainingSetupError)


def register(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser(
        "train",
        help="train an experiment: checkpoints, resume, evaluation, export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("experiment", type=Path, help="experiment YAML")
    group = train.add_mutually_exclusive_group()
    group.add_argument(
        "--workers", type=int, default=1, help="launch N local workers under a supervisor"
    )
    group.add_argument(
        "--worker",
        action="store_true",
        help="run as one worker of the cluster TF_CONFIG describes (used by launchers)",
    )
    train.add_argument("--max-restarts", type=int, default=3, help="supervisor restarts (N>1)")
    train.add_argument("--no-export", action="store_true", help="skip publishing the model")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(handler=run_train)

    export = subparsers.add_parser(
        "export", help="publish a model version from an experiment's latest checkpoint"
    )
    export.add_argument("experiment", type=Path, help="experiment YAML")
    export.set_defaults(handler=run_export)


def run_train(args: argparse.Namespace) -> int:
    from research.experiments import load_experiment

    config = load_experiment(args.experiment)
    if args.workers > 1:
        return _launch(args, config)
    from training.trainer import Trainer

    trainer = Trainer(config, verbose=not args.quiet)
    outcome = trainer.run()
    if outcome.exit_code != 0:
        return outcome.exit_code
    console.print(
        f"trained {outcome.step} steps ({outcome.precision}, "
        f"{outcome.examples_per_second:,.0f} examples/s); weights sha256 {outcome.weights_sha256}",
        soft_wrap=True,
    )
    for split, values in outcome.metrics.items():
        shown = ", ".join(f"{k}={v:.4g}" for k, v in values.items() if k != "examples")
        console.print(f"  {split}: {shown}")
    if not args.no_export:
        from training.publish import publish_model

        published = publish_model(
            trainer.model,
            config,
            trainer.manifest,
            trainer.io,
            metrics=outcome.metrics,
            method=outcome.precision,
            is_chief=trainer.role.is_chief,
        )
        if published is not None:
            console.print(f"published version {published[0]}: {published[1]}")
    return 0


def _launch(args: argparse.Namespace, config) -> int:  # noqa: ANN001 - ExperimentConfig
    from training.supervisor import Supervisor

    command = [sys.executable, "-m", "slipway", "train", str(args.experiment), "--worker"]
    if args.no_export:
        command.append("--no-export")
    if args.quiet:
        command.append("--quiet")
    supervisor = Supervisor(
        command,
        args.workers,
        max_restarts=args.max_restarts,
        log_dir=config.run_path / "workers",
        permanent_exit_codes=(EXIT_INVALID, EXIT_DIVERGED),
    )
    return supervisor.run()


def run_export(args: argparse.Namespace) -> int:
    from research.experiments import load_experiment
    from training.publish import export_from_checkpoint

    config = load_experiment(args.experiment)
    version, path = export_from_checkpoint(config)
    console.print(f"published version {version}: {path}")
    return 0
