"""Compression benchmarks: ``python -m benchmarks.compression [--quick]``.

Two real models are trained here with the trainer on datasets built by the data
pipeline (the digits CNN and the text Transformer of ``examples/experiments``, in
float32), published, and compressed with ``compression.pipeline.compress``. Every
figure is measured side by side in the same run against the float32 baseline:

1. int8 TFLite size against the float32 TFLite (goal: at most 0.30x);
2. 50 % magnitude pruning, gzipped, against the float32 TFLite file (goal: at most
   0.6x; the figure against the gzipped float32 file is shown beside it);
3. accuracy drop of each, in points, against the float32 SavedModel (limit 1.0, goal 0.5);
4. int8 TFLite latency at batch 1 against the float32 SavedModel's (goal: at least 2x
   faster), both measured the same way (warm-up, then p50 over many runs).

Results are printed as a table and written to ``benchmarks/results/compression.json``;
the full compression reports (Markdown, JSON, PNG) are written beside it.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import benchmark_parser, machine_info, write_results

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_FILE = REPO_ROOT / "benchmarks" / "results" / "compression.json"
EXPERIMENTS = REPO_ROOT / "examples" / "experiments"

INT8_SIZE_GOAL = 0.30
PRUNE_GZIP_GOAL = 0.6
MAX_ACCURACY_DROP = 1.0
ACCURACY_DROP_GOAL = 0.5
LATENCY_SPEEDUP_GOAL = 2.0
METHODS = ("int8", "prune")


@dataclass(frozen=True)
class Case:
    """One model: its experiment file, the dataset it trains on, and training epochs."""

    name: str
    experiment: str
    dataset: str
    spec: str
    epochs: int
    quick_epochs: int


CASES = (
    Case("digits CNN", "digits_cnn.yaml", "digits", "digits.yaml", epochs=12, quick_epochs=4),
    Case(
        "text Transformer",
        "text_transformer.yaml",
        "corpus",
        "corpus.yaml",
        epochs=3,
        quick_epochs=1,
    ),
)


def build_datasets(workdir: Path) -> dict[str, Path]:
    """The demo's raw data (digits, generated corpus) built by the Beam pipeline."""
    from research.data.pipeline import build_dataset
    from research.data.spec import load_spec
    from slipway.demo import write_raw_data

    raw = workdir / "raw"
    write_raw_data(raw)
    built = {}
    for case in CASES:
        output = workdir / "datasets" / case.dataset
        build_dataset(load_spec(raw / case.spec), output)
        built[case.dataset] = output
    return built


def train_and_publish(case: Case, dataset: Path, workdir: Path, quick: bool) -> Path:
    """Train the example experiment in float32 on ``dataset``; the published version dir."""
    from research.experiments.config import load_experiment
    from research.experiments.task import ExperimentTask
    from training.run import train

    config = yaml.safe_load((EXPERIMENTS / case.experiment).read_text(encoding="utf-8"))
    config["data"]["dataset"] = str(dataset)
    config["run_dir"] = str(workdir / "runs" / config["name"])
    config["export"]["model_root"] = str(workdir / "models")
    config["training"]["epochs"] = case.quick_epochs if quick else case.epochs
    # The baseline the goals are stated against is a float32 model.
    config["training"]["precision"] = "float32"
    path = workdir / "experiments" / case.experiment
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    outcome = train(ExperimentTask(load_experiment(path)), progress=False)
    if outcome.exit_code != 0:
        raise RuntimeError(f"{case.name}: training exited with {outcome.exit_code}")
    published = outcome.published
    assert published is not None  # a single process is the chief
    return published[1]


def _row(report: Mapping[str, Any], method: str, artifact: str = "TFLite") -> dict[str, Any]:
    for row in report["results"]:
        if row["method"] == method and row["artifact"] == artifact:
            return row
    raise KeyError(f"{method} {artifact} is not in the report")


def figures(report: Mapping[str, Any]) -> dict[str, Any]:
    """The benchmark's ratios, from the measured rows of one compression report."""
    baseline = _row(report, "float32", "SavedModel")
    float_tflite = _row(report, "float32")
    int8, pruned = _row(report, "int8"), _row(report, "prune")
    return {
        "baseline_accuracy": baseline["accuracy"],
        "float32_tflite_bytes": float_tflite["size_bytes"],
        "float32_tflite_gzip_bytes": float_tflite["gzip_bytes"],
        "int8_bytes": int8["size_bytes"],
        "int8_size_ratio": int8["size_bytes"] / float_tflite["size_bytes"],
        "int8_accuracy_drop": int8["accuracy_drop"],
        "int8_agreement": int8["agreement"],
        "prune_sparsity": pruned["details"].get("overall_sparsity"),
        "prune_gzip_bytes": pruned["gzip_bytes"],
        "prune_gzip_ratio": pruned["gzip_bytes"] / float_tflite["size_bytes"],
        "prune_gzip_vs_gzip_ratio": pruned["gzip_bytes"] / float_tflite["gzip_bytes"],
        "prune_accuracy_drop": pruned["accuracy_drop"],
        "savedmodel_p50_ms": baseline["latency_p50_ms"],
        "float32_tflite_p50_ms": float_tflite["latency_p50_ms"],
        "int8_p50_ms": int8["latency_p50_ms"],
        "int8_p99_ms": int8["latency_p99_ms"],
        "int8_speedup_vs_savedmodel": baseline["latency_p50_ms"] / int8["latency_p50_ms"],
        "int8_speedup_vs_float32_tflite": float_tflite["latency_p50_ms"] / int8["latency_p50_ms"],
    }


def bench_case(
    case: Case, dataset: Path, workdir: Path, quick: bool, report_root: Path
) -> dict[str, Any]:
    from compression.evaluate import EvalSettings
    from compression.pipeline import CompressOptions, compress

    started = time.perf_counter()
    version_dir = train_and_publish(case, dataset, workdir, quick)
    trained = time.perf_counter()
    report_dir = report_root / case.dataset
    run = compress(
        version_dir,
        dataset,
        CompressOptions(
            methods=METHODS,
            max_accuracy_drop=MAX_ACCURACY_DROP,
            settings=EvalSettings(latency_runs=100 if quick else 300, warmup_runs=20),
        ),
        report_dir,
    )
    report = run.report.to_json()
    return {
        "model": case.name,
        "experiment": case.experiment,
        "train_seconds": trained - started,
        "compress_seconds": time.perf_counter() - trained,
        "examples": run.baseline.examples,
        "report": str(run.files.markdown),
        **figures(report),
        "statuses": {row["method"]: row["status"] for row in report["results"][1:]},
    }


def _times_faster(ratio: float) -> str:
    return f"{ratio:.1f}x faster" if ratio >= 1 else f"{1 / ratio:.1f}x slower"


def _status(ok: bool, goal_ok: bool | None = None) -> str:
    if not ok:
        return "[red]missed"
    return "[green]goal met" if goal_ok in (None, True) else "[yellow]within limit"


def print_table(results: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Slipway compression benchmarks{' (quick)' if results['quick'] else ''}")
    for column in ("model", "measure", "value", "float32 baseline", "ratio", "goal", "status"):
        table.add_column(column)
    for case in results["cases"]:
        name = case["model"]
        kib = 1024
        table.add_row(
            name, "int8 TFLite size", f"{case['int8_bytes'] / kib:.1f} KiB",
            f"{case['float32_tflite_bytes'] / kib:.1f} KiB (TFLite)",
            f"{case['int8_size_ratio']:.2f}x", f"<= {INT8_SIZE_GOAL:.2f}x",
            _status(case["int8_size_ratio"] <= INT8_SIZE_GOAL),
        )  # fmt: skip
        table.add_row(
            "", f"prune {case['prune_sparsity']:.0%} + gzip",
            f"{case['prune_gzip_bytes'] / kib:.1f} KiB",
            f"{case['float32_tflite_bytes'] / kib:.1f} KiB (TFLite)",
            f"{case['prune_gzip_ratio']:.2f}x ({case['prune_gzip_vs_gzip_ratio']:.2f}x of its gzip)",
            f"<= {PRUNE_GZIP_GOAL:.1f}x", _status(case["prune_gzip_ratio"] <= PRUNE_GZIP_GOAL),
        )  # fmt: skip
        for method in METHODS:
            drop = case[f"{method}_accuracy_drop"]
            table.add_row(
                "", f"{method} accuracy change", f"{round(-drop, 2) + 0.0:+.2f} pts",
                f"{100 * case['baseline_accuracy']:.2f}%", "",
                f"drop <= {MAX_ACCURACY_DROP:g} (goal {ACCURACY_DROP_GOAL:g})",
                _status(drop <= MAX_ACCURACY_DROP, drop <= ACCURACY_DROP_GOAL),
            )  # fmt: skip
        speedup = case["int8_speedup_vs_savedmodel"]
        table.add_row(
            "", "int8 TFLite p50, batch 1", f"{case['int8_p50_ms']:.3f} ms",
            f"{case['savedmodel_p50_ms']:.3f} ms (SavedModel)", _times_faster(speedup),
            f">= {LATENCY_SPEEDUP_GOAL:g}x", _status(speedup >= LATENCY_SPEEDUP_GOAL),
        )  # fmt: skip
        table.add_row(
            "", "  same, against float32 TFLite", f"{case['int8_p50_ms']:.3f} ms",
            f"{case['float32_tflite_p50_ms']:.3f} ms (TFLite)",
            _times_faster(case["int8_speedup_vs_float32_tflite"]), "", "",
        )  # fmt: skip
    Console().print(table)


def run(quick: bool, output: Path) -> dict[str, Any]:

    results: dict[str, Any] = {
        "quick": quick,
        "machine": machine_info(),
        "goals": {
            "int8_size_ratio": INT8_SIZE_GOAL,
            "prune_gzip_ratio": PRUNE_GZIP_GOAL,
            "max_accuracy_drop": MAX_ACCURACY_DROP,
            "accuracy_drop_goal": ACCURACY_DROP_GOAL,
            "int8_speedup_vs_savedmodel": LATENCY_SPEEDUP_GOAL,
        },
    }
    with tempfile.TemporaryDirectory(prefix="slipway-bench-compression-") as tmp:
        workdir = Path(tmp)
        datasets = build_datasets(workdir)
        report_root = output.parent / "compression"
        shutil.rmtree(report_root, ignore_errors=True)
        results["cases"] = [
            bench_case(case, datasets[case.dataset], workdir, quick, report_root) for case in CASES
        ]
    write_results(output, results, print_table)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(
        "benchmarks.compression", __doc__, "fewer training epochs and runs", RESULTS_FILE
    )
    args = parser.parse_args(argv)
    run(args.quick, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
