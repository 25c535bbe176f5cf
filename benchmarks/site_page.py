"""The site's Benchmarks page, written at build time from ``benchmarks/results/*.json``.

A mkdocs hook (``hooks:`` in mkdocs.yml): ``on_files`` adds the page ``benchmarks.md``
as a generated file, so every figure on it is the one a benchmark run wrote, and none is
typed by hand. Rerun a benchmark (``python -m benchmarks.NAME [--quick]``), commit its
JSON and the next build shows it.

Each results file becomes a section: how it was run (``--quick`` or not, on which
machine), what the benchmark measures (its module's docstring), then its figures as
tables. The JSON files differ in shape, so the tables follow the shape: a mapping of
scalars is a key-value table (nested mappings flattened to dotted keys), and a
collection of records (a list of mappings, or a mapping whose values are all mappings)
is one table with a column per record.

mkdocs loads this file by its path, without the repository on ``sys.path``, so it
imports the standard library and mkdocs only.
"""

from __future__ import annotations

import ast
import json
import re
import statistics
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = "benchmarks.md"
RUN_KEYS = ("quick", "machine")  # how the run was made, shown above its figures
# Raw material the summary figures come from (per-process probes, shard checksums): in
# the JSON file for whoever wants it, left off the page.
RAW_KEYS = frozenset({"probes", "shard_sha256"})
LONGEST_LIST = 6  # a longer list of numbers (one per timed block) is shown as its spread

Records = dict[str, dict[str, Any]]  # record name -> flattened figures


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: add the generated page to the site's files."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render_page()))
    return files


def results_files() -> list[Path]:
    return sorted(RESULTS.glob("*.json"))


def render_page() -> str:
    """The whole page: an introduction, a summary of the runs, one section per file."""
    files = results_files()
    runs = [(path, json.loads(path.read_text(encoding="utf-8"))) for path in files]
    lines = [
        "# Benchmarks\n",
        "Every figure below is read from `benchmarks/results/*.json` when the site is built: "
        "the files the benchmarks write, as committed. Rerun one with `python -m "
        "benchmarks.NAME` (add `--quick` for the short version) and rebuild the site to "
        "see its new figures. Timings depend on the machine and on what else it runs, so "
        "the figures that carry over are the ratios each benchmark measures side by side "
        "in one run.\n",
        "| results | run | machine |",
        "|---|---|---|",
    ]
    lines += [
        f"| [{path.stem}](#{_anchor(path.stem)}) | {_run(r)} | {_machine(r)} |" for path, r in runs
    ]
    for path, results in runs:
        lines += render_results(path.stem, results)
    return "\n".join(lines) + "\n"


def render_results(name: str, results: Mapping[str, Any]) -> list[str]:
    """One results file as a section of the page."""
    command = f"python -m benchmarks.{name.replace('-', '_')}"
    quick = " --quick" if results.get("quick") else ""
    lines = [
        f"\n## {name}\n",
        f"`{command}{quick}`: {_run(results)}, on {_machine(results)}.\n",
    ]
    about = module_docstring(name)
    if about:
        body = "\n".join(f"    {line}" if line else "" for line in about.splitlines())
        lines += ['??? note "What it measures"', "", body, ""]
    figures = {key: value for key, value in results.items() if key not in RUN_KEYS}
    lines += _block(figures, level=3)
    return lines


def module_docstring(name: str) -> str | None:
    """The benchmark module's docstring as Markdown, read without importing the module."""
    module = ROOT / "benchmarks" / f"{name.replace('-', '_')}.py"
    if not module.exists():
        return None
    text = ast.get_docstring(ast.parse(module.read_text(encoding="utf-8")))
    if not text:
        return None
    text = re.sub(r":\w+:`", "`", text)  # a Sphinx role, :mod:`x`, is code here
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def _run(results: Mapping[str, Any]) -> str:
    if "quick" not in results:
        return "run not recorded"
    return "a `--quick` run (smaller sizes, fewer repeats)" if results["quick"] else "a full run"


def _machine(results: Mapping[str, Any]) -> str:
    machine = results.get("machine") or {}
    load = ", ".join(f"{value:.2f}" for value in machine.get("load_average", ()))
    parts = [
        f"{machine['cpus']} CPUs" if "cpus" in machine else None,
        f"Python {machine['python']}" if "python" in machine else None,
        f"TensorFlow {machine['tensorflow']}" if "tensorflow" in machine else None,
        f"load average {load}" if load else None,
    ]
    return ", ".join(part for part in parts if part) or "machine not recorded"


# --------------------------------------------------------------------------------- tables


def _block(value: Mapping[str, Any], level: int) -> list[str]:
    """A mapping's scalars as a key-value table, then each collection of records in it, at
    any depth, under a heading of its own."""
    scalars = dict(_flatten(value, ""))
    lines = []
    if scalars:
        lines += ["| figure | value |", "|---|---|"]
        lines += [f"| {_cell(key)} | {_cell(_text(item))} |" for key, item in scalars.items()]
    for key, records in _collections(value, ""):
        lines += [f"\n{'#' * level} {key.replace('_', ' ')}\n", *_record_table(records)]
    return lines


def _collections(value: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Records]]:
    """(dotted key, records) of every collection of records in a mapping, and in its
    records (a workload's comparisons are a collection of their own)."""
    for key, item in value.items():
        if key in RAW_KEYS:
            continue
        records = _records(item)
        if records is not None:
            yield f"{prefix}{key}", records
            members = item.items() if isinstance(item, Mapping) else enumerate(item, 1)
            for name, member in members:
                yield from _collections(member, f"{prefix}{key}.{name}.")
        elif isinstance(item, Mapping):
            yield from _collections(item, f"{prefix}{key}.")


def _flatten(value: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    """(dotted key, scalar) of a mapping, collections of records and raw keys left out."""
    for key, item in value.items():
        if key in RAW_KEYS or _records(item) is not None:
            continue
        if isinstance(item, Mapping):
            yield from _flatten(item, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", item


def _records(value: Any) -> Records | None:
    """Record name -> its flattened figures, when ``value`` is a collection of records."""
    if isinstance(value, list) and value and all(isinstance(item, Mapping) for item in value):
        return {str(index): dict(_flatten(item, "")) for index, item in enumerate(value, 1)}
    if isinstance(value, Mapping) and value and all(isinstance(v, Mapping) for v in value.values()):
        return {str(name): dict(_flatten(item, "")) for name, item in value.items()}
    return None


def _record_table(records: Records) -> list[str]:
    """One row per figure, one column per record (records have many figures, few records)."""
    figures = list(dict.fromkeys(key for figures in records.values() for key in figures))
    lines = [
        "| figure | " + " | ".join(_cell(name) for name in records) + " |",
        "|---|" + "---|" * len(records),
    ]
    for figure in figures:
        cells = [
            _cell(_text(values[figure])) if figure in values else "" for values in records.values()
        ]
        lines.append(f"| {_cell(figure)} | " + " | ".join(cells) + " |")
    return lines


def _text(value: Any) -> str:
    """A figure as a person reads it: 4 significant digits, yes/no, lists joined (a long
    list of numbers summed up by its median and range)."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, list) and len(value) > LONGEST_LIST and all(map(_is_number, value)):
        low, middle, high = min(value), statistics.median(value), max(value)
        return f"{len(value)} values: median {_text(middle)}, {_text(low)} to {_text(high)}"
    if isinstance(value, list):
        return ", ".join(_text(item) for item in value)
    if isinstance(value, str) and value.startswith(f"{ROOT}/"):
        return value[len(f"{ROOT}/") :]  # where the run wrote it, inside the repository
    return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def _anchor(heading: str) -> str:
    """The id mkdocs' table of contents gives a heading of plain words."""
    return re.sub(r"[^\w]+", "-", heading.lower()).strip("-")
