"""What every benchmark does the same way: describe the machine, save and show results."""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


def machine_info() -> dict[str, Any]:
    """Enough about the machine to read the figures in context (timings drift here)."""
    import tensorflow as tf

    return {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
    }


def write_results(
    output: Path, results: Mapping[str, Any], print_table: Callable[[Any], None]
) -> None:
    """Write the JSON results, then print the table a person reads."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print_table(results)
    print(f"results written to {output}")


def benchmark_parser(
    module: str, doc: str, quick_help: str, results_file: Path
) -> argparse.ArgumentParser:
    """The options every benchmark takes: ``--quick`` (what it shortens) and ``--output``."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument(
        "--output", type=Path, default=results_file, help=f"JSON results (default: {results_file})"
    )
    return parser


# The columns of the trainer benchmarks' table, which the sections run on their own share.
TRAINER_COLUMNS = (
    "benchmark",
    "model",
    "measured",
    "baseline",
    "ratio",
    "per CPU s",
    "goal",
    "status",
)


def print_rows(title: str, rows: Iterable[Sequence[str]]) -> None:
    """One section's rows of the trainer benchmarks' table, as a table of its own."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in TRAINER_COLUMNS:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    Console(width=180).print(table)
