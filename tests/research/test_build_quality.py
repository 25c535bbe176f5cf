"""Builds that must be refused, as a new user would meet them, and builds that must not be.

Each refusal is ``slipway data build`` exiting 3 with a message naming the rule that
took the records and a few of them, while the destination — and a dataset already
there, even with ``--overwrite`` — stays byte for byte as it was.
"""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from contracts.dataset_manifest import Manifest, SplitInfo, load_manifest, write_manifest
from research.data import pipeline
from research.data.rejects import DROPPED_FILE, QUARANTINE_FILE, WriteRejects, write_entries
from research.data.report import REPORT_FILE, build_report
from research.data.shards import shard_file_name, write_shard
from research.data.spec import QualitySpec
from tests.support.cli import slipway
from tests.support.raw_data import (
    tabular_rows,
    tabular_spec,
    write_spec,
    write_tabular_csv,
    write_tabular_dataset_inputs,
)
from tests.support.shards import leftovers, tree_digest

REFUSED = 3


def one_line(text: str) -> str:
    return " ".join(text.split())


def build(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str]:
    """``slipway data build ARGV``: its exit code and what it printed to stderr."""
    capsys.readouterr()
    code = slipway("data", "build", *argv)
    return code, one_line(capsys.readouterr().err)


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset built from 200 good rows: what a refused overwrite must leave intact."""
    raw = tmp_path_factory.mktemp("good")
    spec = write_tabular_dataset_inputs(raw, "table", tabular_rows(200, seed=3))
    assert slipway("data", "build", spec, "-o", raw / "table") == 0
    return raw / "table"


@pytest.fixture
def existing(good: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(good, tmp_path / "datasets" / "table"))


# --------------------------------------------------------------------------- inputs


def decimal_comma_csv(directory: Path) -> Path:
    """scikit-learn's breast cancer measurements written the European way: ``17,99``."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    lines = ["radius;texture;target"]
    for values, target in zip(data.data, data.target, strict=True):
        radius, texture = (f"{value:g}".replace(".", ",") for value in values[:2])
        lines.append(f"{radius};{texture};{target}")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cancer.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return write_spec(
        directory / "cancer.yaml",
        {
            "name": "table",
            "sources": [{"type": "csv", "path": "cancer.csv", "delimiter": ";"}],
            "infer_schema": False,
            "schema": {
                "radius": {"type": "numeric"},
                "texture": {"type": "numeric"},
                "target": {"type": "categorical"},
            },
            "labels": ["target"],
        },
    )


def docstrings_jsonl(path: Path) -> int:
    """Docstrings of standard-library classes and functions with their ``kind``, one JSON
    object a line; returns how many."""
    import csv
    import pathlib
    import string
    import textwrap

    rows = []
    for module in (json, csv, pathlib, string, textwrap, inspect):
        for name, member in inspect.getmembers(module):
            doc = inspect.getdoc(member)
            if name.startswith("_") or not doc:
                continue
            if not (inspect.isfunction(member) or inspect.isclass(member)):
                continue
            kind = "class" if inspect.isclass(member) else "function"
            rows.append(
                {"name": f"{module.__name__}.{name}", "doc": doc.split("\n\n")[0], "kind": kind}
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return len(rows)


def docstrings_spec(directory: Path, label: str) -> Path:
    return write_spec(
        directory / "docs.yaml",
        {
            "name": "table",
            "sources": [{"type": "jsonl", "path": "docs.jsonl"}],
            "schema": {"doc": {"type": "text"}, label: {"type": "categorical"}},
            "labels": [label],
            "vocab": {"size": 64},
        },
    )


# --------------------------------------------------------------------------- refusals


def test_every_row_quarantined_is_refused_naming_the_rule_and_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = decimal_comma_csv(tmp_path / "raw")
    code, error = build(capsys, spec, "-o", tmp_path / "out" / "table")
    assert code == REFUSED
    assert "no records in split(s) 'train', 'validation', 'test'" in error
    assert "569 of 569 input records (100.0%) were quarantined or dropped" in error
    assert "quality.max_quarantine_fraction = 0.5" in error
    assert "conform.quarantined.radius:" in error
    for line in (2, 3, 4):  # the first three rows, with the value that did not fit
        assert f"cancer.csv:{line}: field 'radius': expected numeric float32" in error
    assert "got '17,99'" in error
    assert "cancer.csv:5:" not in error.split("conform.quarantined.texture")[0]
    assert not (tmp_path / "out" / "table").exists()
    assert leftovers(tmp_path / "out", "table") == []


def test_a_label_no_record_carries_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    count = docstrings_jsonl(tmp_path / "docs.jsonl")
    spec = docstrings_spec(tmp_path, label="knid")  # the records say "kind"
    code, error = build(capsys, spec, "-o", tmp_path / "out")
    assert code == REFUSED
    assert f"clean.dropped.required.knid: {count} records dropped" in error
    assert "docs.jsonl:1: required field 'knid' has no value" in error
    assert "docs.jsonl:3: required field 'knid' has no value" in error
    assert not (tmp_path / "out").exists()


def test_a_mistyped_column_in_a_csv_spec_is_refused_before_the_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_tabular_csv(tmp_path / "table.csv", tabular_rows(50, seed=1))
    spec = write_spec(
        tmp_path / "table.yaml",
        {
            "name": "table",
            "sources": [{"type": "csv", "path": "table.csv"}],
            "schema": {"colr": {"type": "categorical"}},
            "labels": ["colr"],
        },
    )
    code, error = build(capsys, spec, "-o", tmp_path / "out")
    assert code in (2, REFUSED)  # refused by the spec checks, or else by the quality gate
    assert "colr" in error
    assert not (tmp_path / "out").exists()


def test_an_empty_csv_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "table.csv").write_bytes(b"")
    spec = write_spec(
        tmp_path / "table.yaml",
        {
            "name": "table",
            "sources": [{"type": "csv", "path": "table.csv"}],
            "infer_schema": False,
            "schema": {"x": {"type": "numeric"}},
        },
    )
    code, error = build(capsys, spec, "-o", tmp_path / "out")
    assert code in (2, REFUSED)
    assert "table.csv" in error
    assert not (tmp_path / "out").exists()


def test_a_csv_with_only_its_header_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_tabular_dataset_inputs(tmp_path, "table", [])
    code, error = build(capsys, spec, "-o", tmp_path / "out")
    assert code == REFUSED
    assert "no records in split(s) 'train', 'validation', 'test'" in error
    assert not (tmp_path / "out").exists()


def test_overwrite_with_a_refused_build_keeps_the_dataset_byte_identical(
    existing: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree_digest(existing)
    spec = decimal_comma_csv(tmp_path / "raw")
    code, error = build(capsys, spec, "-o", existing, "--overwrite")
    assert code == REFUSED
    # The console may break the long path at a slash: compare without the breaks.
    refused = f"{existing}: the build was refused and nothing was written there"
    assert "".join(refused.split()) in "".join(error.split())
    assert tree_digest(existing) == before
    assert leftovers(existing.parent, "table") == []
    assert slipway("data", "validate", existing) == 0


def rows_with_short_notes(count: int, short_every: int) -> list[dict[str, Any]]:
    rows = tabular_rows(count, seed=5)
    for index, row in enumerate(rows):
        if index % short_every:
            row["note"] = "tiny"
    return rows


def test_losing_more_than_the_allowed_share_is_refused(
    existing: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree_digest(existing)
    spec = write_tabular_dataset_inputs(tmp_path, "table", rows_with_short_notes(300, 3))
    spec_text = spec.read_text(encoding="utf-8")
    spec.write_text(spec_text + "clean:\n  length:\n    note: {min: 10}\n", encoding="utf-8")
    code, error = build(capsys, spec, "-o", existing, "--overwrite")
    assert code == REFUSED
    assert "200 of 300 input records (66.7%) were quarantined or dropped" in error
    assert "clean.dropped.too_short.note: 200 records dropped" in error
    assert "table.csv:3: field 'note' has 4 characters, clean.length.note.min is 10" in error
    assert tree_digest(existing) == before


def test_a_loss_within_the_allowed_share_is_built_and_logged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_tabular_dataset_inputs(tmp_path, "table", rows_with_short_notes(300, 3))
    spec_text = spec.read_text(encoding="utf-8")
    spec.write_text(
        spec_text + "clean:\n  length:\n    note: {min: 10}\n"
        "quality:\n  max_quarantine_fraction: 0.7\n",
        encoding="utf-8",
    )
    code, _ = build(capsys, spec, "-o", tmp_path / "out")
    assert code == 0
    report = json.loads((tmp_path / "out" / REPORT_FILE).read_text())
    assert report["quality"] == {
        "inputs": 300,
        "lost": 200,
        "lost_fraction": pytest.approx(2 / 3, abs=1e-6),
        "max_quarantine_fraction": 0.7,
        "empty_splits": [],
        "unreadable_files": 0,
        "passed": True,
    }
    lines = (tmp_path / "out" / DROPPED_FILE).read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    assert len(entries) == report["records_dropped"] == 200
    assert [entry["origin"] for entry in entries] == [
        f"table.csv:{index + 2}" for index in range(300) if index % 3
    ]
    assert {entry["rule"] for entry in entries} == {"clean.dropped.too_short.note"}


def test_duplicates_are_not_a_loss(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = tabular_rows(40, seed=6)
    copies = [rows[index % 40] for index in range(160)]
    spec = write_tabular_dataset_inputs(tmp_path, "table", rows + copies)
    code, _ = build(capsys, spec, "-o", tmp_path / "out")
    assert code == 0
    report = json.loads((tmp_path / "out" / REPORT_FILE).read_text())
    assert report["records_merged"] == 160 and report["quality"]["lost"] == 0
    entries = [json.loads(line) for line in (tmp_path / "out" / DROPPED_FILE).open()]
    assert len(entries) == 160
    first = entries[0]
    assert first["origin"] == "table.csv:42" and first["kept"] == "table.csv:2"
    assert first["rule"] == "dedup.exact.merged" and first["similarity"] == 1.0


# --------------------------------------------------------------------------- side files


def write_json_elsewhere(name: str, elsewhere: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the workers write ``name`` to another directory, as a misconfigured cluster does."""
    original = pipeline._write_json

    def redirected(path: str) -> Any:
        if Path(path).name == name:
            path = str(elsewhere / name)
        return original(path)

    monkeypatch.setattr(pipeline, "_write_json", redirected)


@pytest.mark.parametrize("name", ["shards.json", "statistics.json", "categories.json"])
def test_a_side_file_the_workers_did_not_write_refuses_the_build(
    name: str,
    existing: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = tree_digest(existing)
    (tmp_path / "elsewhere").mkdir()
    write_json_elsewhere(name, tmp_path / "elsewhere", monkeypatch)
    spec = write_tabular_dataset_inputs(tmp_path / "raw", "table", tabular_rows(150, seed=9))
    code, error = build(capsys, spec, "-o", existing, "--overwrite")
    assert code == REFUSED
    assert f"{name}: missing after the pipeline finished" in error
    assert tree_digest(existing) == before
    assert leftovers(existing.parent, "table") == []


@pytest.mark.parametrize("log", [QUARANTINE_FILE, DROPPED_FILE])
def test_a_log_the_workers_did_not_write_refuses_the_build(
    log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def elsewhere(path: str, *args: Any) -> WriteRejects:
        if Path(path).name == log:
            path = str(tmp_path / log)
        return WriteRejects(path, *args)

    monkeypatch.setattr(pipeline, "WriteRejects", elsewhere)
    spec = write_tabular_dataset_inputs(tmp_path / "raw", "table", tabular_rows(150, seed=9))
    code, error = build(capsys, spec, "-o", tmp_path / "out")
    assert code == REFUSED
    assert f"{log}: missing after the pipeline finished" in error
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- validate, help


def test_validate_fails_on_a_dataset_with_no_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The dataset an empty build used to publish: empty shards under a valid manifest."""
    root = tmp_path / "empty"
    root.mkdir()
    splits = {
        name: SplitInfo(
            name=name, shards=(write_shard(root, shard_file_name(name, 0, 1, "none"), [], "none"),)
        )
        for name in ("train", "validation", "test")
    }
    write_manifest(
        root,
        Manifest(
            name="empty",
            spec_hash="0" * 64,
            compression="none",
            features={},
            labels=[],
            splits=splits,
        ),
    )
    report = build_report({}, dict.fromkeys(splits, 0), QualitySpec())
    (root / REPORT_FILE).write_text(json.dumps(report))
    for log in (QUARANTINE_FILE, DROPPED_FILE):
        write_entries([], str(root / log))
    assert load_manifest(root).splits["train"].num_records == 0
    capsys.readouterr()
    assert slipway("data", "validate", root, "--json") == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert [p["message"] for p in problems if p["check"] == "split.empty"] == [
        f"{root / 'manifest.json'}: split '{name}' holds no records"
        for name in ("train", "validation", "test")
    ]


def test_build_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        slipway("data", "build", "--help")
    text = one_line(capsys.readouterr().out)
    assert "Exit codes: 0 built; 2 the spec, a source or the destination is wrong" in text
    assert "3 the build ran and was refused" in text
    assert "quality.max_quarantine_fraction" in text


def test_an_empty_split_from_a_split_key_with_few_values_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = tabular_rows(120, seed=8)
    write_tabular_csv(tmp_path / "table.csv", rows)
    text = (tmp_path / "table.csv").read_text().splitlines()
    sites = [text[0] + ",site"] + [f"{line},{'abc'[i % 3]}" for i, line in enumerate(text[1:])]
    (tmp_path / "table.csv").write_text("\n".join(sites) + "\n")
    spec = tabular_spec("table")
    spec["exclude"] = ["site"]
    spec["split"] = {"key": "site"}
    code, error = build(capsys, write_spec(tmp_path / "table.yaml", spec), "-o", tmp_path / "out")
    assert code == REFUSED
    assert "- no records in split(s) " in error
    assert (
        "- split.key has only 3 distinct value(s) among the records, for 3 splits: every "
        "record with one key value goes to one split"
    ) in error
    spec["split"] = {"key": "id"}  # one value per record: no such note when a split is empty
    spec["quality"] = {"max_quarantine_fraction": 0.5}
    code, _ = build(capsys, write_spec(tmp_path / "table.yaml", spec), "-o", tmp_path / "out")
    assert code == 0
    report = json.loads((tmp_path / "out" / REPORT_FILE).read_text())
    rules = {rule["rule"]: rule["count"] for rule in report["rules"]}
    assert rules["split_key.distinct_values"] == 120


def test_a_source_file_unreadable_when_the_build_reads_it_refuses_the_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks before the build refuse a CSV whose header repeats a name. One that
    turns so after them (here: the check is skipped) holds rows nobody counted: the
    build is refused rather than counting the file as one lost input of 301."""
    from research.data import sources
    from research.data.csv_source import read_csv

    spec = write_tabular_dataset_inputs(tmp_path, "table", tabular_rows(300, seed=9))
    write_tabular_csv(tmp_path / "more.csv", tabular_rows(300, seed=10))
    (tmp_path / "more.csv").write_text(
        (tmp_path / "more.csv").read_text().replace("id,x,colour,note", "id,x,x,note", 1)
    )
    data = tabular_spec("table")
    data["sources"].append({"type": "csv", "path": "more.csv"})
    write_spec(spec, data)
    code, error = build(capsys, spec, "-o", tmp_path / "out")
    assert code == 2 and "more.csv:1: the header repeats 'x' (columns 2 and 3)" in error

    columns = ["id", "x", "colour", "note"]
    monkeypatch.setitem(sources._READERS, "csv", sources._Reader(read_csv, lambda unit: columns))
    code, error = build(capsys, spec, "-o", tmp_path / "out")
    assert code == REFUSED
    assert "- 1 source file(s) could not be read to the end" in error
    assert "more.csv:1: the header repeats 'x'" in error  # the quarantined entry, quoted
    assert not (tmp_path / "out").exists()
