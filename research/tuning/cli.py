"""``slipway tune``: hyper-parameter search over an experiment (keras-tuner).

Exit codes: 0 the search found a best trial (``best.yaml`` written), 1 no trial
completed, 2 the experiment, space or dataset is invalid (nothing was trained).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from research.configs import ConfigError
from research.data.manifest import DatasetError

if TYPE_CHECKING:
    from research.tuning.search import SearchResult

USER_ERRORS = (ConfigError, DatasetError)

console = Console()


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    tune = subparsers.add_parser(
        "tune",
        help="search an experiment's hyper-parameters (keras-tuner)",
        description=__doc__,
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


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


def short_names(paths: Sequence[str]) -> list[str]:
    """The shortest dotted suffix of each path that no other path ends with."""
    names = []
    for path in paths:
        parts = path.split(".")
        for size in range(1, len(parts) + 1):
            suffix = ".".join(parts[-size:])
            if not any(other != path and f".{other}".endswith(f".{suffix}") for other in paths):
                break
        names.append(suffix)
    return names


def results_table(result: SearchResult) -> Table:
    """Every trial in the order it ran: its values, epochs, objective and status.

    Columns are headed by the shortest unambiguous end of each parameter's path. The
    best trial is marked and bold; a trial that did not complete shows its error's last
    line.
    """
    arrow = "↓" if result.direction == "min" else "↑"
    best_id = result.best.trial_id if result.best else None
    rows = []
    for trial in result.trials:
        status = trial.status.lower()
        if trial.message and trial.status != "COMPLETED":
            status += f": {trial.message.strip().splitlines()[-1]}"
        rows.append(
            [
                f"{trial.trial_id}{' ★' if trial.trial_id == best_id else ''}",
                *(_shown(trial.values.get(name, "-")) for name in result.parameters),
                str(trial.epochs),
                "-" if trial.score is None else _shown(trial.score),
                status,
            ]
        )
    headers = ["trial", *short_names(result.parameters), "epochs", result.objective, "status"]
    table = Table(title=f"{result.tuner_type} search: {result.objective} {arrow}")
    for index, header in enumerate(headers):
        is_status = index == len(headers) - 1
        # values keep their width (headers fold instead); a long error message folds
        widest = (
            len("completed") if is_status else max((len(row[index]) for row in rows), default=1)
        )
        justify = "left" if index in (0, len(headers) - 1) else "right"
        table.add_column(header, justify=justify, overflow="fold", min_width=widest)
    for trial, row in zip(result.trials, rows, strict=True):
        style = "bold" if trial.trial_id == best_id else None
        table.add_row(*map(escape, row), style=style)
    return table


def run_tune(args: argparse.Namespace) -> int:
    from research.tuning.search import run_search

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
    if result.best_config_path is None:
        console.print("[red]no trial completed[/]; see the messages in the results")
        return 1
    console.print(f"best experiment: [bold]{result.best_config_path}[/]")
    return 0
