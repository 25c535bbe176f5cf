"""``slipway compress``: compress a published model, report the trade-offs, publish the winner.

Exit codes: 0 done (and published when asked), 1 publishing was asked for but refused
because no eligible result passed the quality gate, 2 bad input (a message naming it).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console

from compression.errors import CompressionError
from compression.methods import DEFAULT_ALPHA, DEFAULT_TEMPERATURE, METHOD_NAMES, THEN_METHODS
from contracts.dataset_manifest import DatasetError, load_manifest
from contracts.model_manifest import SAVED_MODEL_FILE

USER_ERRORS = (CompressionError, DatasetError)

# What fits a terminal; piped output (a log, a CI artifact) and the Markdown report have
# every column.
TERMINAL_COLUMNS = (
    "method", "artifact", "accuracy", "Δ accuracy (pts)", "size ratio", "gz ratio",
    "p50 (ms)", "speed-up", "status",
)  # fmt: skip
_TEXT_COLUMNS = ("method", "artifact", "status")
# Rich lays out for 80 columns when it cannot ask a terminal; a table read from a pipe
# must keep every cell whole, so piped output gets a width no row reaches.
PIPE_WIDTH = 1000

console = Console(log_path=False)


def results_console() -> Console:
    """The terminal's console, or a wide one that never wraps when stdout is a pipe."""
    if console.is_terminal:
        return console
    return Console(log_path=False, width=PIPE_WIDTH, soft_wrap=True)


def register(subparsers: argparse._SubParsersAction) -> None:
    compress = subparsers.add_parser(
        "compress",
        help="prune / quantize a model version, report accuracy, size and latency, publish",
        description="Compress a model version with one or more methods, measure each result "
        "like for like against the float32 TFLite conversion on the dataset's test split "
        "(accuracy, agreement, size and gzipped size ratios, batch-1 speed-up, throughput), write a JSON/Markdown/PNG report "
        "and optionally publish a passing result as a new version of a model repository.",
    )
    compress.add_argument("model", type=Path, help="model version directory (<repo>/<model>/<n>)")
    compress.add_argument("--data", type=Path, required=True, help="dataset directory")
    compress.add_argument(
        "--method",
        required=True,
        help=f"comma-separated methods: {', '.join(METHOD_NAMES)}",
    )
    compress.add_argument(
        "--out", type=Path, help="model repository to publish into (needed with --publish)"
    )
    compress.add_argument(
        "--max-accuracy-drop",
        type=float,
        default=1.0,
        metavar="POINTS",
        help="largest accuracy loss (percentage points) a result may have and pass (default 1.0)",
    )
    compress.add_argument(
        "--max-error-increase",
        type=float,
        default=2.0,
        metavar="PERCENT",
        help="largest growth of a regression head's mean absolute error (percent of the "
        "float32 conversion's) a result may have and pass (default 2.0)",
    )
    compress.add_argument(
        "--publish",
        nargs="?",
        const="auto",
        metavar="METHOD",
        help="publish a passing result (default: the smallest passing integer one)",
    )
    compress.add_argument(
        "--report-dir",
        type=Path,
        help="where report.json/.md/.png go (default: compression-reports/<model>-v<version>)",
    )
    compress.add_argument("--epochs", type=int, help="fine-tuning epochs for retraining methods")
    compress.add_argument(
        "--sparsity", type=float, default=0.5, help="target sparsity of prune and prune_qat"
    )
    compress.add_argument("--clusters", type=int, default=16, help="weight clusters per layer")
    compress.add_argument(
        "--student",
        type=Path,
        metavar="EXPERIMENT_YAML",
        help="distill: the student's experiment file (its model, epochs and learning rate; "
        "it trains on the teacher's dataset)",
    )
    compress.add_argument(
        "--then",
        choices=THEN_METHODS,
        help="distill: quantize the trained student too (int8 as --method int8 does)",
    )
    compress.add_argument(
        "--temperature",
        type=float,
        default=DEFAULT_TEMPERATURE,
        help=f"distill: softmax temperature of the soft targets (default {DEFAULT_TEMPERATURE:g})",
    )
    compress.add_argument(
        "--alpha",
        type=float,
        default=DEFAULT_ALPHA,
        help=f"distill: share of the soft-target loss, the rest on the labels "
        f"(default {DEFAULT_ALPHA:g})",
    )
    compress.add_argument("--split", default="test", help="split to evaluate on (default: test)")
    compress.add_argument("--name", help="model name in --out (default: the source model's)")
    compress.add_argument(
        "--allow-contract-change",
        action="store_true",
        help="publish even if the result's inputs or outputs (names, dtypes, shapes) differ "
        "from the newest version in --out, which clients of that version would notice",
    )
    compress.add_argument(
        "--latency-runs", type=int, default=200, help="timed batch-1 runs per artifact"
    )
    compress.set_defaults(handler=run_compress)


def check_paths(model: Path, data: Path) -> None:
    """Refuse a missing model version or dataset before TensorFlow loads (seconds)."""
    if not model.is_dir():
        raise CompressionError(f"{model}: not a directory")
    if not (model / SAVED_MODEL_FILE).is_file():
        raise CompressionError(f"{model}: not a SavedModel (no {SAVED_MODEL_FILE})")
    load_manifest(data)


def run_compress(args: argparse.Namespace) -> int:
    check_paths(args.model, args.data)
    from rich.table import Table

    from compression.evaluate import EvalSettings
    from compression.pipeline import CompressOptions, MethodOptions, compress
    from compression.report import COLUMNS, table_cells

    if args.epochs is not None and args.epochs < 1:
        raise CompressionError(f"--epochs must be >= 1, got {args.epochs}")
    if args.latency_runs < 1:
        raise CompressionError(f"--latency-runs must be >= 1, got {args.latency_runs}")
    epochs = {} if args.epochs is None else {"epochs": args.epochs}
    method_options = MethodOptions(
        target_sparsity=args.sparsity,
        clusters=args.clusters,
        verbose=1,
        student=args.student,
        then=args.then,
        temperature=args.temperature,
        alpha=args.alpha,
        **epochs,
    )
    options = CompressOptions(
        methods=args.method,
        max_accuracy_drop=args.max_accuracy_drop,
        max_error_increase=args.max_error_increase,
        split=args.split,
        settings=EvalSettings(latency_runs=args.latency_runs),
        method_options=method_options,
        publish=args.publish,
        repository=args.out,
        model_name=args.name,
        allow_contract_change=args.allow_contract_change,
    )
    report_dir = args.report_dir or _default_report_dir(args.model)
    with console.status("starting…") as status:
        run = compress(
            args.model,
            args.data,
            options,
            report_dir,
            progress=lambda message: _progress(status, message),
        )
    out = results_console()
    columns = TERMINAL_COLUMNS if out.is_terminal else COLUMNS
    table = Table(title=f"{run.source.name} version {run.source.version}: compression results")
    for column in columns:
        table.add_column(column, justify="left" if column in _TEXT_COLUMNS else "right")
    for row in run.report.rows:
        cells = table_cells(run.report, row)
        style = {"failed": "red", "baseline": "bold"}.get(row.status)
        table.add_row(*(cells[column] for column in columns[:-1]), row.status, style=style)
    out.print(table)
    for row in run.report.rows:
        if row.note:
            console.print(f"[red]{row.method}:[/] {row.note}")
    console.print(
        f"report: [bold]{run.files.markdown}[/], {run.files.json.name}, {run.files.plot.name}"
    )
    if run.published is not None:
        version, path = run.published
        console.print(f"published version {version}: [bold]{path}[/]")
    if run.refusal is not None:
        console.print(f"[bold red]not published:[/] {run.refusal}")
        return 1
    return 0


def _progress(status, message: str) -> None:  # noqa: ANN001 - rich's Status
    """One timestamped line per stage (not console.log: it pads each line to the width)."""
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {message}", highlight=False)
    status.update(message)


def _default_report_dir(model: Path) -> Path:
    resolved = model.resolve()
    return Path("compression-reports") / f"{resolved.parent.name}-v{resolved.name}"
