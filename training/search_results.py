"""What a search leaves behind: ``results.json``, ``best.yaml`` and the table it prints.

``results.json`` lists every trial in the order it ran (values, epochs, score, last
reported metrics, error message). ``best.yaml`` is the best trial's experiment, written
beside the results with its paths rewritten to name the same places from there and a
run directory of its own, ready for ``slipway train``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import keras_tuner
import yaml
from rich.markup import escape
from rich.table import Table

from contracts.atomic_files import write_json_atomically, write_text_atomically
from research.tuning.space import SearchSpace, experiment_with, set_path
from training.errors import EXIT_OK
from training.preemption import EXIT_PREEMPTED

if TYPE_CHECKING:
    from training.search import SearchPlan

RESULTS_FILE = "results.json"
BEST_FILE = "best.yaml"
BEST_RUN_PREFIX = "best-run-"
EXIT_NO_TRIAL = 1
COMPLETED = keras_tuner.engine.trial.TrialStatus.COMPLETED


@dataclass(frozen=True)
class TrialResult:
    trial_id: str
    status: str
    values: dict[str, Any]
    score: float | None
    epochs: int
    metrics: dict[str, float]  # the last epoch's
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
    preempted: bool = False

    @property
    def exit_code(self) -> int:
        """``slipway tune``'s: 143 preempted, 1 no trial completed, else 0."""
        if self.preempted:
            return EXIT_PREEMPTED
        return EXIT_OK if self.best_config_path is not None else EXIT_NO_TRIAL


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def trial_result(
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


def forget_results(output_dir: Path) -> None:
    """Remove the results of a search that is being replaced."""
    for name in (RESULTS_FILE, BEST_FILE):
        (output_dir / name).unlink(missing_ok=True)


def write_results(
    plan: SearchPlan,
    oracle: keras_tuner.Oracle,
    output_dir: Path,
    *,
    stopped: str | None,
    preempted: bool,
) -> SearchResult:
    """Write ``best.yaml`` (when a trial completed) and ``results.json``."""
    trials = [
        trial_result(oracle.trials[trial_id], plan.space, plan.max_epochs)
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
            f"# `slipway train` on this file trains as the trials did, for {plan.max_epochs} "
            "epochs.\n"
            f"# Paths are relative to this file; {data['run_dir']}/ is a new run directory.\n"
        )
        body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
        write_text_atomically(best_path, header + body)
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
        preempted=preempted,
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
    write_json_atomically(result.results_path, document)
    return result


# -- the table ---------------------------------------------------------------------------


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
