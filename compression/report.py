"""The trade-off report: what each compression method cost in accuracy and won in size and speed.

Three files from the same rows, the float32 baseline always first so every other row
reads against it: ``report.json`` (every measured number, for tools), ``report.md`` (a
table for people and code review) and ``report.png`` (accuracy against raw size, gzipped
size and latency, one point per method). Nothing here computes a figure of its own beyond ratios
and differences of measured ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compression.evaluate import EvalSettings, Evaluation
from contracts.atomic_files import write_json_atomically

FORMAT = "slipway.compression_report/1"
JSON_FILE = "report.json"
MARKDOWN_FILE = "report.md"
PLOT_FILE = "report.png"

TFLITE = "TFLite"
BASELINE = "baseline"
PASSED = "passed"
FAILED = "failed"


@dataclass(frozen=True)
class Row:
    """One measured artifact: the baseline SavedModel or one method's result.

    ``accuracy_drop`` is in percentage points against the baseline (positive: worse),
    the largest over the classification heads; ``note`` says why a row failed.
    """

    method: str
    artifact: str  # "SavedModel" | "TFLite"
    evaluation: Evaluation
    status: str
    accuracy_drop: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True)
class Report:
    """Everything the report files show. ``rows[0]`` is the baseline.

    Every TFLite row's size, gzipped size and latency are divided by those of the TFLite
    row named ``size_reference``: the float32 conversion of the same model, the file a
    compressed model replaces, run by the same runner. The baseline SavedModel row is
    there for accuracy (conversion must not lose any) and has no ratios.
    """

    model: dict[str, Any]
    dataset: str
    split: str
    max_accuracy_drop: float
    settings: EvalSettings
    rows: Sequence[Row]
    size_reference: str = "float32"
    machine: dict[str, Any] = field(default_factory=dict)
    published: dict[str, Any] | None = None
    max_error_increase: float = 2.0  # percent of a regression head's MAE

    def __post_init__(self) -> None:
        if not self.rows or self.rows[0].status != BASELINE:
            raise ValueError("a report starts with the baseline row")

    @property
    def baseline(self) -> Row:
        return self.rows[0]

    def reference_row(self) -> Row:
        """The float32 TFLite conversion every method's result replaces."""
        for row in self.rows[1:]:
            if row.method == self.size_reference and row.artifact == TFLITE:
                return row
        raise ValueError(f"the report has no {self.size_reference} TFLite row to compare with")

    def _comparable(self, row: Row) -> bool:
        """Only TFLite results are compared with the float32 TFLite: a SavedModel runs in
        another runtime and is stored as a directory, so its ratios would mislead."""
        return row.artifact == TFLITE

    def size_ratio(self, row: Row) -> float | None:
        """Raw flatbuffer bytes against the float32 TFLite's raw bytes."""
        if not self._comparable(row):
            return None
        return row.evaluation.size_bytes / self.reference_row().evaluation.size_bytes

    def gzip_ratio(self, row: Row) -> float | None:
        """Gzipped bytes against the gzipped float32 TFLite (what zeros of pruning win)."""
        if not self._comparable(row):
            return None
        return row.evaluation.gzip_bytes / self.reference_row().evaluation.gzip_bytes

    def speedup(self, row: Row) -> float | None:
        """float32 TFLite's median batch-1 latency over this row's, timed interleaved."""
        if not self._comparable(row):
            return None
        return self.reference_row().evaluation.latency_p50_ms / row.evaluation.latency_p50_ms

    def to_json(self) -> dict[str, Any]:
        reference = self.reference_row()
        return {
            "format": FORMAT,
            "model": self.model,
            "dataset": self.dataset,
            "split": self.split,
            "max_accuracy_drop": self.max_accuracy_drop,
            "max_error_increase_percent": self.max_error_increase,
            "settings": self.settings.to_json(),
            "machine": self.machine,
            "reference": {"method": reference.method, "artifact": reference.artifact},
            "results": [
                {
                    "method": row.method,
                    "artifact": row.artifact,
                    "status": row.status,
                    "note": row.note,
                    "accuracy_drop": row.accuracy_drop,
                    "size_ratio": self.size_ratio(row),
                    "gzip_ratio": self.gzip_ratio(row),
                    "speedup": self.speedup(row),
                    **row.evaluation.to_json(),
                    "details": row.details,
                }
                for row in self.rows
            ],
            "published": self.published,
        }


@dataclass(frozen=True)
class ReportFiles:
    json: Path
    markdown: Path
    plot: Path


# -- markdown -------------------------------------------------------------------------

COLUMNS = (
    "method", "artifact", "accuracy", "Δ accuracy (pts)", "agreement", "max abs diff",
    "size", "size ratio", "gz size", "gz ratio", "p50 (ms)", "speed-up", "p99 (ms)",
    "throughput (ex/s)", "status",
)  # fmt: skip


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.2f}%"


def _number(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}g}"


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def human_bytes(count: int) -> str:
    units = ("B", "KiB", "MiB", "GiB")
    value, unit = float(count), 0
    while value >= 1024 and unit < len(units) - 1:
        value, unit = value / 1024, unit + 1
    return f"{count} B" if unit == 0 else f"{value:.1f} {units[unit]}"


def _status(report: Report, row: Row) -> str:
    published = report.published
    if published and published.get("method") == row.method and row.status == PASSED:
        return f"passed, published as version {published['version']}"
    return f"{row.status}: {row.note}" if row.note else row.status


def table_cells(report: Report, row: Row) -> dict[str, str]:
    """One row of the table as text by column (the CLI prints a subset of the same)."""
    evaluation = row.evaluation
    drop = None if row.accuracy_drop is None else -row.accuracy_drop
    cells = [
        row.method,
        row.artifact,
        _percent(evaluation.mean_accuracy),
        "—" if drop is None else f"{round(drop, 2) + 0.0:+.2f}",
        _percent(evaluation.mean_agreement),
        _number(evaluation.max_abs_diff),
        human_bytes(evaluation.size_bytes),
        _ratio(report.size_ratio(row)),
        human_bytes(evaluation.gzip_bytes),
        _ratio(report.gzip_ratio(row)),
        f"{evaluation.latency_p50_ms:.3f}",
        _ratio(report.speedup(row)),
        f"{evaluation.latency_p99_ms:.3f}",
        f"{evaluation.throughput:,.0f}",
        _status(report, row),
    ]
    return dict(zip(COLUMNS, cells, strict=True))


def _choices(details: dict[str, Any]) -> list[str]:
    """The reasons a method recorded for its choices (int8's scheme, also inside distill)."""
    found = [details["reason"]] if isinstance(details.get("reason"), str) else []
    for value in details.values():
        if isinstance(value, dict):
            found += _choices(value)
    return found


def render_markdown(report: Report) -> str:
    model = report.model
    reference = report.reference_row()
    lines = [
        f"# Compression report: {model.get('name', '?')} version {model.get('version', '?')}",
        "",
        f"- source: `{model.get('path', '?')}`",
        f"- evaluated on split `{report.split}` of `{report.dataset}` "
        f"({report.baseline.evaluation.examples} examples)",
        f"- quality gate: a result may lose at most {report.max_accuracy_drop:g} percentage "
        f"points on any classification head, and a regression head's mean absolute error "
        f"may grow at most {report.max_error_increase:g} %, against the {reference.method} "
        f"{reference.artifact} (that conversion: against the SavedModel)",
        f"- like for like: every TFLite result against the {reference.method} "
        f"{reference.artifact} ({human_bytes(reference.evaluation.size_bytes)}, "
        f"{human_bytes(reference.evaluation.gzip_bytes)} gzipped): Δ accuracy, size ratio "
        "(raw bytes over raw bytes), gz ratio (gzip over gzip), speed-up (its p50 over "
        "this p50); the SavedModel row only shows what conversion costs in accuracy",
        f"- latency: batch 1, the same LiteRT runner with {report.settings.num_threads} "
        f"thread(s) for every TFLite model, {report.settings.warmup_runs} warm-up runs, then "
        f"{report.settings.latency_runs} rounds timing each model once in rotating order; "
        f"p50 is the median; throughput at batch {report.settings.batch_size}",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
    ]
    for row in report.rows:
        cells = [cell.replace("|", "\\|") for cell in table_cells(report, row).values()]
        lines.append("| " + " | ".join(cells) + " |")
    choices = [(row.method, reason) for row in report.rows for reason in _choices(row.details)]
    if choices:
        lines += ["", "## What the methods chose", ""]
        lines += [f"- **{method}**: {reason}" for method, reason in choices]
    if report.published:
        lines += [
            "",
            f"Published `{report.published['method']}` as version "
            f"{report.published['version']}: `{report.published['path']}`",
        ]
    return "\n".join(lines) + "\n"


# -- plot -----------------------------------------------------------------------------


def _quality(report: Report) -> tuple[str, list[float | None]]:
    """The y axis: accuracy (%) when the model has classification heads, else MAE."""
    if report.baseline.evaluation.mean_accuracy is not None:
        values = [row.evaluation.mean_accuracy for row in report.rows]
        return "accuracy (%)", [None if v is None else 100 * v for v in values]
    maes = [row.evaluation.mae for row in report.rows]
    return "mean absolute error", [float(sum(m.values()) / len(m)) if m else None for m in maes]


STYLES = {
    BASELINE: {"marker": "*", "s": 240},
    PASSED: {"marker": "o", "s": 70},
    FAILED: {"marker": "X", "s": 100},
}


def _label(row: Row) -> str:
    return f"{row.method} ({row.artifact})" + ("" if row.status == PASSED else f", {row.status}")


def _short_label(row: Row) -> str:
    return row.method if row.artifact == "TFLite" else f"{row.method} ({row.artifact})"


def _stagger(points: list[tuple[float, float]]) -> list[int]:
    """Vertical label offsets (in label lines) that keep labels of nearby points apart.

    Points are compared in the axes' normalised space (log x), where a label is about a
    fifth of the width long and a twentieth of the height tall. A point near labelled
    ones gets the next free line above them if it lies higher, below them otherwise.
    """
    xs = [math.log10(x) for x, _ in points]
    ys = [y for _, y in points]
    width = (max(xs) - min(xs)) or 1.0
    height = (max(ys) - min(ys)) or 1.0
    lines: list[int] = []
    for index, (x, y) in enumerate(zip(xs, ys, strict=True)):
        near = [
            other for other in range(index)
            if abs(xs[other] - x) / width < 0.2 and abs(ys[other] - y) / height < 0.05
        ]  # fmt: skip
        if not near:
            lines.append(0)
        elif y >= max(ys[other] for other in near):
            lines.append(max(lines[other] for other in near) + 1)
        else:
            lines.append(min(lines[other] for other in near) - 1)
    return lines


def _plain_log_ticks(axis: Any) -> None:
    """Tick labels as plain numbers (0.5, 20, 300), at 1, 2 and 5 times each power of ten."""
    from matplotlib import ticker

    axis.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    axis.xaxis.set_minor_formatter(
        ticker.FuncFormatter(lambda value, _: f"{value:g}" if f"{value:e}"[0] in "25" else "")
    )


def write_plot(report: Report, path: str | Path) -> Path:
    """Accuracy against raw size, gzipped size (KiB) and p50 latency (ms): a point per row.

    The gzipped panel is where pruning shows: its zeros cost as much as any weight in the
    raw file and almost nothing once compressed.

    Each row has its own colour (named in the legend) and a marker for its status, the
    baseline a star; the dashed line is the accuracy gate.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    label, quality = _quality(report)
    panels = (
        ("quality vs size", "size on disk (KiB, log scale)",
         [r.evaluation.size_bytes / 1024 for r in report.rows]),
        ("quality vs compressed size", "gzipped size (KiB, log scale)",
         [r.evaluation.gzip_bytes / 1024 for r in report.rows]),
        ("quality vs latency", "latency p50 at batch 1 (ms, log scale)",
         [r.evaluation.latency_p50_ms for r in report.rows]),
    )  # fmt: skip
    colors = plt.get_cmap("tab10").colors
    figure, axes = plt.subplots(1, len(panels), figsize=(19, 6.5), layout="constrained")
    for axis, (title, xlabel, xs) in zip(axes, panels, strict=True):
        shown = [
            (index, x, y) for index, (x, y) in enumerate(zip(xs, quality, strict=True))
            if y is not None and math.isfinite(x) and x > 0
        ]  # fmt: skip
        lines = _stagger([(x, y) for _, x, y in shown]) if shown else []
        for (index, x, y), line in zip(shown, lines, strict=True):
            row = report.rows[index]
            axis.scatter(
                [x], [y], color=colors[index % len(colors)], zorder=3,
                edgecolors="black", linewidths=0.5, label=_label(row), **STYLES[row.status],
            )  # fmt: skip
            axis.annotate(
                _short_label(row), (x, y), textcoords="offset points", xytext=(8, 4 + 11 * line),
                fontsize=8, color=colors[index % len(colors)],
            )  # fmt: skip
        if label.startswith("accuracy") and quality[0] is not None:
            gate = quality[0] - report.max_accuracy_drop
            axis.axhline(gate, color="tab:red", linestyle="--", linewidth=1)
            axis.annotate(
                f"accuracy gate (−{report.max_accuracy_drop:g} pts)", (0.01, gate),
                xycoords=("axes fraction", "data"), textcoords="offset points",
                xytext=(0, 4), fontsize=8, color="tab:red",
            )  # fmt: skip
        axis.set_xscale("log")
        axis.margins(x=0.2, y=0.15)
        _plain_log_ticks(axis)
        axis.set_title(title)
        axis.set_xlabel(xlabel)
        axis.set_ylabel(label)
        axis.grid(True, which="both", alpha=0.3)
    handles, names = axes[0].get_legend_handles_labels()
    figure.legend(handles, names, loc="outside lower center", ncols=min(4, len(names) or 1),
                  fontsize=9, frameon=False)  # fmt: skip
    model = report.model
    figure.suptitle(
        f"{model.get('name', '?')} v{model.get('version', '?')}: compression trade-offs "
        f"({report.split} split, {report.baseline.evaluation.examples} examples)"
    )
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)


def write_report(report: Report, directory: str | Path) -> ReportFiles:
    """Write the JSON, Markdown and PNG files into ``directory`` (created if needed)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    write_json_atomically(root / JSON_FILE, report.to_json())
    (root / MARKDOWN_FILE).write_text(render_markdown(report), encoding="utf-8")
    return ReportFiles(root / JSON_FILE, root / MARKDOWN_FILE, write_plot(report, root / PLOT_FILE))
