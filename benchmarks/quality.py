"""Model quality benchmark: ``python -m benchmarks.quality [--quick]``.

Does a zoo model, trained as the example experiment says, reach what a textbook
scikit-learn model reaches on the same data? Five tasks, all from data installed here
(``slipway.raw_data``, nothing downloaded):

- tabular, binary: breast cancer (``breast_cancer_mlp.yaml``) against a standardized
  logistic regression;
- tabular, three classes: wine (``wine_mlp.yaml``), the same baseline;
- images: the 8x8 digits (``digits_cnn.yaml``) against a standardized logistic
  regression on the 64 pixels;
- text: the package of a standard-library docstring (``docstrings_words.yaml``)
  against TF-IDF (words and word pairs) and a linear SVM;
- regression: diabetes progression (``diabetes_linear.yaml``) against a standardized
  ridge regression.

Each dataset is built with its example spec, and each experiment is trained with
``slipway train`` as a user runs it; the model's accuracy is the test accuracy its
published version records in ``slipway.json``. The baseline reads the same dataset's
train and test shards back, so both are trained and tested on exactly the same records.
Goal: within 1 point of the baseline's test accuracy, or better; for the regression, a
mean absolute error and an R² each within 5 % of the baseline's, or better. With a test
split of a few dozen to a few hundred records one record is worth 0.3 to 2.6 points, so
the table gives the test size next to every figure.

Results are printed as a table and written to ``benchmarks/results/quality.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import yaml

from benchmarks.common import benchmark_parser, machine_info, write_results
from slipway.raw_data import (
    copy_sklearn_csv,
    write_diabetes_csv,
    write_digits_npz,
    write_docstrings_jsonl,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = REPO_ROOT / "examples"
RESULTS_FILE = REPO_ROOT / "benchmarks" / "results" / "quality.json"
GOAL_POINTS = 1.0  # the model may trail the baseline by at most this many points
GOAL_RELATIVE = 0.05  # a regression's MAE and R² may be at most this much worse
QUICK_EPOCH_FRACTION = 0.2

Baseline = Literal["logistic_regression", "tfidf_linear_svm", "ridge_regression"]


@dataclass(frozen=True)
class QualityTask:
    """One dataset, the example experiment that trains a zoo model on it, and its baseline."""

    name: str
    spec: str  # file under examples/data
    experiment: str  # file under examples/experiments
    baseline: Baseline
    write_raw: Callable[[Path], Path]  # writes the spec's source file into a directory


TASKS = (
    QualityTask(
        "breast_cancer",
        "breast_cancer.yaml",
        "breast_cancer_mlp.yaml",
        "logistic_regression",
        partial(copy_sklearn_csv, "breast_cancer.csv"),
    ),
    QualityTask(
        "wine",
        "wine.yaml",
        "wine_mlp.yaml",
        "logistic_regression",
        partial(copy_sklearn_csv, "wine_data.csv"),
    ),
    QualityTask(
        "digits", "digits.yaml", "digits_cnn.yaml", "logistic_regression", write_digits_npz
    ),
    QualityTask(
        "docstrings",
        "docstrings.yaml",
        "docstrings_words.yaml",
        "tfidf_linear_svm",
        write_docstrings_jsonl,
    ),
    QualityTask(
        "diabetes", "diabetes.yaml", "diabetes_linear.yaml", "ridge_regression", write_diabetes_csv
    ),
)


# --- the baseline's side: the built dataset read back --------------------------------


@dataclass(frozen=True)
class Split:
    """One split's records as scikit-learn takes them: inputs and label values."""

    inputs: Any  # a float matrix, or a list of texts
    labels: list[Any]  # category values (str), or numbers for a numeric label


def read_split(dataset: Path, split: str) -> Split:
    """Every record of ``split``, in shard order, as the shards hold them.

    Numeric features and image pixels become the columns of one float matrix; a single
    text feature is kept as text. The label is the single label's category value, or its
    number for a numeric label.
    """
    import numpy as np
    import tensorflow as tf

    from contracts.dataset_manifest import load_manifest
    from contracts.features import parsing_spec

    manifest = load_manifest(dataset)
    if len(manifest.labels) != 1:
        raise ValueError(f"{dataset}: a baseline needs exactly one label, not {manifest.labels}")
    (label,) = manifest.labels
    inputs = {name: spec for name, spec in manifest.features.items() if not spec.is_label}
    kinds = {spec.type for spec in inputs.values()}
    if kinds == {"text"} and len(inputs) == 1:
        text = True
    elif kinds <= {"numeric", "image"}:
        text = False
    else:
        raise ValueError(f"{dataset}: no baseline for inputs of kinds {sorted(kinds)}")
    parse = parsing_spec({**inputs, label: manifest.features[label]})
    records = tf.data.TFRecordDataset(
        manifest.shard_paths(dataset, split), compression_type=manifest.tfrecord_compression
    )
    rows: list[Any] = []
    labels: list[str] = []
    for batch in records.batch(1024):
        parsed = tf.io.parse_example(batch, parse)
        values = parsed[label].numpy()
        if manifest.features[label].type == "numeric":
            labels.extend(float(value) for value in values)
        else:
            labels.extend(value.decode("utf-8") for value in values)
        if text:
            rows.extend(value.decode("utf-8") for value in parsed[next(iter(inputs))].numpy())
            continue
        columns = [
            _pixels(parsed[name]) if spec.type == "image" else parsed[name].numpy()
            for name, spec in inputs.items()
        ]
        rows.extend(np.concatenate([c.reshape(len(c), -1) for c in columns], axis=1))
    return Split(rows if text else np.asarray(rows, dtype=np.float64), labels)


def _pixels(encoded: Any) -> Any:
    import numpy as np
    import tensorflow as tf

    return np.stack([tf.io.decode_image(png).numpy() for png in encoded])


def baseline_accuracy(kind: Baseline, train: Split, test: Split) -> float:
    """Test accuracy of the textbook model for the data, fitted on ``train`` alone."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import LinearSVC

    if kind == "logistic_regression":
        model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
    else:
        model = make_pipeline(
            TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), min_df=2), LinearSVC()
        )
    model.fit(train.inputs, train.labels)
    return float(model.score(test.inputs, test.labels))


def baseline_regression(train: Split, test: Split) -> dict[str, float]:
    """Test MAE and R² of a standardized ridge regression fitted on ``train`` alone."""
    from sklearn.linear_model import Ridge
    from sklearn.metrics import mean_absolute_error, r2_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = make_pipeline(StandardScaler(), Ridge()).fit(train.inputs, train.labels)
    predicted = model.predict(test.inputs)
    return {
        "mae": float(mean_absolute_error(test.labels, predicted)),
        "r2": float(r2_score(test.labels, predicted)),
    }


def regression_verdict(model: Mapping[str, float], baseline: Mapping[str, float]) -> dict[str, Any]:
    """Whether the MAE is at most 5 % above the baseline's and the R² at most 5 % below."""
    mae_ratio = model["mae"] / baseline["mae"]
    r2_shortfall = (baseline["r2"] - model["r2"]) / abs(baseline["r2"])
    met = mae_ratio <= 1.0 + GOAL_RELATIVE and r2_shortfall <= GOAL_RELATIVE
    return {
        "mae_ratio": round(mae_ratio, 4),
        "r2_shortfall": round(r2_shortfall, 4),
        "goal": f"MAE and R² within {GOAL_RELATIVE:.0%} of the baseline's or better",
        "verdict": "met" if met else "missed",
    }


def verdict(model_accuracy: float, baseline_accuracy: float) -> dict[str, Any]:
    """The difference in points and whether it meets the goal (at most 1 point behind)."""
    difference = round(100.0 * (model_accuracy - baseline_accuracy), 2)
    return {
        "difference_points": difference,
        "goal": f"within {GOAL_POINTS:g} point of the baseline or better",
        "verdict": "met" if difference >= -GOAL_POINTS else "missed",
    }


# --- the model's side: built and trained as a user does ------------------------------


def prepare(workdir: Path, tasks: Sequence[QualityTask]) -> None:
    """Raw files and specs in ``raw/``, each dataset built into ``datasets/<name>``."""
    from research.data.pipeline import build_dataset
    from research.data.spec import load_spec

    raw = workdir / "raw"
    for task in tasks:
        task.write_raw(raw)
        spec = Path(shutil.copy(EXAMPLES / "data" / task.spec, raw / task.spec))
        build_dataset(load_spec(spec), workdir / "datasets" / task.name, overwrite=True)


def train_model(task: QualityTask, workdir: Path, *, quick: bool) -> dict[str, Any]:
    """``slipway train`` on the example experiment; the published version's test figures
    for the label (``accuracy``, or ``mae`` and ``r2`` for a regression).

    The experiment is copied to ``experiments/`` beside ``datasets/``, where its relative
    paths point; ``quick`` shortens it to a fifth of its epochs.
    """
    from contracts.dataset_manifest import load_manifest
    from slipway.cli import main as slipway

    config = yaml.safe_load((EXAMPLES / "experiments" / task.experiment).read_text("utf-8"))
    if quick:
        epochs = config["training"]["epochs"]
        config["training"]["epochs"] = max(1, round(epochs * QUICK_EPOCH_FRACTION))
    experiment = workdir / "experiments" / task.experiment
    experiment.parent.mkdir(parents=True, exist_ok=True)
    experiment.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    started = time.perf_counter()
    code = slipway(["train", str(experiment), "--quiet"])
    seconds = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"slipway train {experiment} exited {code}")
    (label,) = load_manifest(workdir / "datasets" / task.name).labels
    versions = workdir / "models" / config["export"]["model_name"]
    latest = max(versions.iterdir(), key=lambda path: int(path.name))
    published = json.loads((latest / "slipway.json").read_text("utf-8"))
    test = published["metrics"]["test"]
    scores = ("mae", "r2") if task.baseline == "ridge_regression" else ("accuracy",)
    return {
        **{score: test[f"{label}_{score}"] for score in scores},
        "examples": int(test["examples"]),
        "epochs": config["training"]["epochs"],
        "train_seconds": round(seconds, 1),
    }


def measure(task: QualityTask, workdir: Path, *, quick: bool) -> dict[str, Any]:
    """One task's model and baseline on the same split, and the verdict."""
    dataset = workdir / "datasets" / task.name
    train, test = read_split(dataset, "train"), read_split(dataset, "test")
    model = train_model(task, workdir, quick=quick)
    if model["examples"] != len(test.labels):
        raise RuntimeError(
            f"{task.name}: the model was tested on {model['examples']} records, the baseline "
            f"on {len(test.labels)}: not the same split"
        )
    common = {
        "experiment": task.experiment,
        "baseline": task.baseline,
        "train_records": len(train.labels),
        "test_records": len(test.labels),
        "epochs": model["epochs"],
        "train_seconds": model["train_seconds"],
    }
    if task.baseline == "ridge_regression":
        baseline_scores = baseline_regression(train, test)
        return {
            **common,
            **{f"model_{k}": round(model[k], 4) for k in ("mae", "r2")},
            **{f"baseline_{k}": round(v, 4) for k, v in baseline_scores.items()},
            **regression_verdict(model, baseline_scores),
        }
    baseline = baseline_accuracy(task.baseline, train, test)
    return {
        **common,
        "classes": len(set(train.labels)),
        "model_accuracy": round(model["accuracy"], 4),
        "baseline_accuracy": round(baseline, 4),
        **verdict(model["accuracy"], baseline),
    }


# --- report -------------------------------------------------------------------------


def print_table(results: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=180)
    quick = " (quick)" if results["quick"] else ""
    table = Table(title=f"Slipway model quality against scikit-learn baselines{quick}")
    for column in (
        "task", "experiment", "test records", "model", "baseline", "baseline model", "difference",
        "goal", "verdict",
    ):  # fmt: skip
        table.add_column(column)
    for name, task in results["tasks"].items():
        style = "green" if task["verdict"] == "met" else "red"
        table.add_row(
            name,
            f"{task['experiment']} ({task['epochs']} epochs, {task['train_seconds']:.0f} s)",
            *_figures(task),
            f"[{style}]{task['verdict']}",
        )
    console.print(table)


def _figures(task: Mapping[str, Any]) -> tuple[str, ...]:
    """Test size, model, baseline, baseline model, difference and goal cells of a row."""
    baseline = task["baseline"].replace("_", " ")
    if "model_mae" in task:
        return (
            f"{task['test_records']}",
            f"MAE {task['model_mae']:.2f}, R² {task['model_r2']:.3f}",
            f"MAE {task['baseline_mae']:.2f}, R² {task['baseline_r2']:.3f}",
            baseline,
            f"MAE ×{task['mae_ratio']:.3f}, R² {-100 * task['r2_shortfall']:+.1f} %",
            f"<= {GOAL_RELATIVE:.0%} worse",
        )
    return (
        f"{task['test_records']} (1 = {100 / task['test_records']:.1f} pts)",
        f"{task['model_accuracy']:.4f}",
        f"{task['baseline_accuracy']:.4f}",
        baseline,
        f"{task['difference_points']:+.2f} pts",
        f">= -{GOAL_POINTS:g} pts",
    )


def run(quick: bool, output: Path) -> dict[str, Any]:
    started = time.perf_counter()
    results: dict[str, Any] = {"quick": quick, "machine": machine_info(), "tasks": {}}
    with tempfile.TemporaryDirectory(prefix="slipway-bench-quality-") as tmp:
        workdir = Path(tmp)
        print("building the datasets ...", flush=True)
        prepare(workdir, TASKS)
        for task in TASKS:
            print(f"  {task.name:<14} training {task.experiment} ...", flush=True)
            results["tasks"][task.name] = measure(task, workdir, quick=quick)
    results["seconds"] = round(time.perf_counter() - started, 1)
    write_results(output, results, print_table)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(
        "benchmarks.quality", __doc__, "a fifth of each experiment's epochs", RESULTS_FILE
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    run(args.quick, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
