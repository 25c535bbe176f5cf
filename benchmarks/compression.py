"""Compression benchmarks: ``python -m benchmarks.compression [--quick]``.

Two real models are trained here with the trainer on datasets built by the data
pipeline (the digits CNN and the text Transformer of ``examples/experiments``, in
float32), published, and compressed with ``compression.pipeline.compress``: int8,
50 % magnitude pruning, and distillation into the example student experiment followed
by int8. Every figure is like for like against the float32 TFLite conversion of the
same model, measured in the same run by the same LiteRT runner:

1. int8 size, raw bytes against raw bytes (goal: at most 0.30x). Every file is stripped
   for serving alike (``compression.strip``: no tensor names, ranges or metadata), the
   float32 one included, so the ratio is what quantization saves; the ratio of the
   files as the converter writes them is recorded beside it
   (``int8_converter_size_ratio``);
2. pruning's size, its sparse weights stored sparse, raw against raw; and gzipped against
   the gzipped float32 TFLite (goal: at most 0.6x);
3. accuracy drop of each result in points (limit 1.0, goal 0.5);
4. batch-1 latency, the median of interleaved rounds (goal: int8 at least 2x faster);
5. how that int8 speed-up grows with channel width (:mod:`benchmarks.int8_scaling`): the
   digits network at its own width and at two and four times it.

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

from benchmarks import int8_scaling
from benchmarks.common import benchmark_parser, machine_info, write_results

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_FILE = REPO_ROOT / "benchmarks" / "results" / "compression.json"
EXPERIMENTS = REPO_ROOT / "examples" / "experiments"

INT8_SIZE_GOAL = 0.30
PRUNE_GZIP_GOAL = 0.6
MAX_ACCURACY_DROP = 1.0
ACCURACY_DROP_GOAL = 0.5
LATENCY_SPEEDUP_GOAL = 2.0
METHODS = ("int8", "prune", "distill")
DISTILLED = "distill+int8"  # the distill row: the student, then int8


@dataclass(frozen=True)
class Case:
    """One model: its experiment file, the dataset it trains on, and training epochs."""

    name: str
    experiment: str
    dataset: str
    spec: str
    epochs: int
    quick_epochs: int
    student: str


CASES = (
    Case(
        "digits CNN",
        "digits_cnn.yaml",
        "digits",
        "digits.yaml",
        epochs=12,
        quick_epochs=4,
        student="digits_mlp_student.yaml",
    ),
    Case(
        "text Transformer",
        "text_transformer.yaml",
        "corpus",
        "corpus.yaml",
        epochs=3,
        quick_epochs=1,
        student="text_transformer_student.yaml",
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
    """The benchmark's figures, from the measured rows of one compression report.

    Ratios are the report's own, all against the float32 TFLite row: raw over raw,
    gzip over gzip, and its median latency over each result's; the int8 size ratio of
    the unstripped files is taken from the sizes the rows record as ``converter_bytes``.
    """
    float_tflite = _row(report, "float32")
    out: dict[str, Any] = {
        "float32_tflite_accuracy": float_tflite["accuracy"],
        "float32_tflite_bytes": float_tflite["size_bytes"],
        "float32_tflite_gzip_bytes": float_tflite["gzip_bytes"],
        "float32_tflite_p50_ms": float_tflite["latency_p50_ms"],
        "conversion_accuracy_drop": float_tflite["accuracy_drop"],
    }
    for method in ("int8", "prune", DISTILLED):
        row = _row(report, method)
        key = method.replace("+", "_")
        out |= {
            f"{key}_bytes": row["size_bytes"],
            f"{key}_size_ratio": row["size_ratio"],
            f"{key}_gzip_bytes": row["gzip_bytes"],
            f"{key}_gzip_ratio": row["gzip_ratio"],
            f"{key}_accuracy_drop": row["accuracy_drop"],
            f"{key}_p50_ms": row["latency_p50_ms"],
            f"{key}_speedup": row["speedup"],
        }
    int8 = _row(report, "int8")["details"]
    out["float32_tflite_converter_bytes"] = float_tflite["details"]["converter_bytes"]
    out["int8_converter_bytes"] = int8["converter_bytes"]
    out["int8_converter_size_ratio"] = (
        int8["converter_bytes"] / out["float32_tflite_converter_bytes"]
    )
    out["int8_scheme"] = int8.get("scheme")
    out["int8_weight_scales"] = int8.get("weight_scales")
    out["int8_reason"] = int8.get("reason")
    prune = _row(report, "prune")["details"]
    out["prune_sparsity"] = prune.get("overall_sparsity")
    out["prune_weight_encoding"] = prune.get("weight_encoding")
    return out


def bench_case(
    case: Case, dataset: Path, workdir: Path, quick: bool, report_root: Path
) -> dict[str, Any]:
    from compression.evaluate import EvalSettings
    from compression.pipeline import CompressOptions, MethodOptions, compress

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
            method_options=MethodOptions(student=EXPERIMENTS / case.student, then="int8"),
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
        # Relative inside the repository, so committed results name no machine's checkout.
        "report": str(
            run.files.markdown.relative_to(REPO_ROOT)
            if run.files.markdown.is_relative_to(REPO_ROOT)
            else run.files.markdown
        ),
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
    for column in ("model", "measure", "value", "float32 TFLite", "ratio", "goal", "status"):
        table.add_column(column)
    kib = 1024
    for case in results["cases"]:
        table.add_row(
            case["model"],
            f"int8 size ({case['int8_scheme']}, {case['int8_weight_scales']} weight scales)",
            f"{case['int8_bytes'] / kib:.1f} KiB", f"{case['float32_tflite_bytes'] / kib:.1f} KiB",
            f"{case['int8_size_ratio']:.3f}x", f"<= {INT8_SIZE_GOAL:.2f}x",
            _status(case["int8_size_ratio"] <= INT8_SIZE_GOAL),
        )  # fmt: skip
        table.add_row(
            "", "int8 size, files as converted",
            f"{case['int8_converter_bytes'] / kib:.1f} KiB",
            f"{case['float32_tflite_converter_bytes'] / kib:.1f} KiB",
            f"{case['int8_converter_size_ratio']:.3f}x", "", "",
        )  # fmt: skip
        table.add_row(
            "", f"prune {case['prune_sparsity']:.0%} size ({case['prune_weight_encoding']} weights)",
            f"{case['prune_bytes'] / kib:.1f} KiB", f"{case['float32_tflite_bytes'] / kib:.1f} KiB",
            f"{case['prune_size_ratio']:.2f}x", "", "",
        )  # fmt: skip
        table.add_row(
            "", f"prune {case['prune_sparsity']:.0%}, gzipped",
            f"{case['prune_gzip_bytes'] / kib:.1f} KiB",
            f"{case['float32_tflite_gzip_bytes'] / kib:.1f} KiB gzipped",
            f"{case['prune_gzip_ratio']:.2f}x", f"<= {PRUNE_GZIP_GOAL:.1f}x",
            _status(case["prune_gzip_ratio"] <= PRUNE_GZIP_GOAL),
        )  # fmt: skip
        table.add_row(
            "", "distill + int8 size", f"{case['distill_int8_bytes'] / kib:.1f} KiB",
            f"{case['float32_tflite_bytes'] / kib:.1f} KiB",
            f"{case['distill_int8_size_ratio']:.2f}x", "", "",
        )  # fmt: skip
        for method, key in (("int8", "int8"), ("prune", "prune"), (DISTILLED, "distill_int8")):
            drop = case[f"{key}_accuracy_drop"]
            table.add_row(
                "", f"{method} accuracy change", f"{round(-drop, 2) + 0.0:+.2f} pts",
                f"{100 * case['float32_tflite_accuracy']:.2f}%", "",
                f"drop <= {MAX_ACCURACY_DROP:g} (goal {ACCURACY_DROP_GOAL:g})",
                _status(drop <= MAX_ACCURACY_DROP, drop <= ACCURACY_DROP_GOAL),
            )  # fmt: skip
        for method, key in (("int8", "int8"), (DISTILLED, "distill_int8")):
            speedup = case[f"{key}_speedup"]
            table.add_row(
                "", f"{method} p50, batch 1", f"{case[f'{key}_p50_ms']:.3f} ms",
                f"{case['float32_tflite_p50_ms']:.3f} ms", _times_faster(speedup),
                f">= {LATENCY_SPEEDUP_GOAL:g}x" if key == "int8" else "",
                _status(speedup >= LATENCY_SPEEDUP_GOAL) if key == "int8" else "",
            )  # fmt: skip
    Console(width=200).print(table)
    int8_scaling.print_table(results["int8_by_width"])


def run(quick: bool, output: Path) -> dict[str, Any]:

    results: dict[str, Any] = {
        "quick": quick,
        "machine": machine_info(),
        "goals": {
            "int8_size_ratio": INT8_SIZE_GOAL,
            "prune_gzip_ratio": PRUNE_GZIP_GOAL,
            "max_accuracy_drop": MAX_ACCURACY_DROP,
            "accuracy_drop_goal": ACCURACY_DROP_GOAL,
            "int8_speedup_vs_float32_tflite": LATENCY_SPEEDUP_GOAL,
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
    results["int8_by_width"] = int8_scaling.measure(latency_runs=100 if quick else 300)
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
