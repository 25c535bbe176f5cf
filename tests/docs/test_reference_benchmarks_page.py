"""The Benchmarks page is built from the committed results: every file has its section,
every collection of records its table, and mkdocs gets the page from the hook."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mkdocs.config import load_config
from mkdocs.structure.files import Files

from benchmarks.site_page import PAGE, module_docstring, render_page, render_results, results_files

ROOT = Path(__file__).resolve().parents[2]


def test_results_are_committed() -> None:
    assert len(results_files()) >= 3, "commit the benchmarks' JSON results in benchmarks/results"


@pytest.mark.parametrize("path", results_files(), ids=lambda path: path.name)
def test_every_results_file_has_a_section_saying_how_it_ran(path: Path) -> None:
    page = render_page()
    results = json.loads(path.read_text(encoding="utf-8"))
    section = page.split(f"\n## {path.stem}\n", 1)[1].split("\n## ", 1)[0]
    kind = "a `--quick` run" if results["quick"] else "a full run"
    assert kind in section
    assert f"TensorFlow {results['machine']['tensorflow']}" in section
    assert "| figure |" in section


def test_records_become_columns_and_nested_figures_dotted_rows() -> None:
    results = {
        "quick": False,
        "machine": {"cpus": 2, "python": "3.11", "tensorflow": "2.21", "load_average": [1, 2, 3]},
        "goal": 0.7,
        "setup": {"batch": 8, "sizes": {"small": 1.23456, "large": 12345.6}},
        "cases": [{"model": "a", "ok": True}, {"model": "b", "ok": False, "note": None}],
        "deep": {"name": "x", "setups": {"one": {"s": 1.0}, "two": {"s": 2.0}}},
        "workloads": {"w": {"batch": 4, "comparisons": {"c": {"r": 1.5}, "d": {"r": 0.5}}}},
        "blocks": [3.0, 1.0, 2.0, 5.0, 4.0, 6.0, 7.0],
        "probes": {"one": {"s": 9.0}},  # raw measurements stay in the JSON file
    }
    lines = render_results("made_up", results)
    text = "\n".join(lines)
    assert "`python -m benchmarks.made_up`: a full run, on 2 CPUs" in text
    assert "| goal | 0.7 |" in text
    assert "| setup.sizes.small | 1.235 |" in text
    assert "| setup.sizes.large | 12346 |" in text
    assert "| figure | 1 | 2 |" in text
    assert "| ok | yes | no |" in text
    assert "| note |  | – |" in text
    assert "### deep.setups" in text and "| s | 1 | 2 |" in text
    assert "### workloads\n\n| figure | w |\n|---|---|\n| batch | 4 |" in text
    assert "### workloads.w.comparisons" in text and "| r | 1.5 | 0.5 |" in text
    assert "| blocks | 7 values: median 4, 1 to 7 |" in text
    assert "probes" not in text


def test_a_benchmarks_docstring_is_shown_as_markdown() -> None:
    about = module_docstring("compression")
    assert about is not None and "``" not in about and ":mod:" not in about
    assert module_docstring("no_such_benchmark") is None


def test_mkdocs_gets_the_page_from_the_hook() -> None:
    config = load_config(str(ROOT / "mkdocs.yml"))
    files = config.plugins.on_files(Files([]), config=config)
    page = files.get_file_from_path(PAGE)
    assert page is not None and page.generated_by == "benchmarks/site_page.py"
    assert page.content_string == render_page()
