"""``slipway data build|validate|show`` as a user runs them, and what they leave on disk.

Commands run in this process through ``slipway.cli.main``, which returns the exit
code: 0 success, 1 a failed check, 2 a usage or input error with a one-line message.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from contracts.dataset_manifest import load_manifest
from contracts.yaml_config import ConfigError
from research.data import cli as data_cli
from research.data import shards
from research.data.pipeline import build_dataset
from research.data.spec import load_spec
from slipway.cli import EXIT_INTERNAL, build_parser
from tests.support.cli import slipway
from tests.support.raw_data import (
    tabular_rows,
    tabular_spec,
    write_spec,
    write_tabular_csv,
    write_tabular_dataset_inputs,
)
from tests.support.shards import leftovers, shard_hashes, tree_digest

TABLE_ROWS = 400


def one_line(text: str) -> str:
    """Terminal output with its wrapping undone, for substring checks."""
    return " ".join(text.split())


def validate_json(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = slipway("data", "validate", *argv, "--json")
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tabular dataset built by ``slipway data build SPEC`` into its default location."""
    raw = tmp_path_factory.mktemp("table")
    write_tabular_dataset_inputs(raw, "table", tabular_rows(TABLE_ROWS, seed=1))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(raw)
        assert slipway("data", "build", "table.yaml") == 0
    return raw / "datasets" / "table"


@pytest.fixture
def table_copy(table: Path, tmp_path: Path) -> Path:
    """A private copy of the built dataset, for tests that replace or damage it."""
    return Path(shutil.copytree(table, tmp_path / "datasets" / "table"))


# --------------------------------------------------------------------------- build


def test_build_writes_a_complete_dataset_at_the_default_location(table: Path) -> None:
    manifest = load_manifest(table)
    assert sum(split.num_records for split in manifest.splits.values()) == TABLE_ROWS
    assert sorted(path.name for path in table.iterdir()) == [
        "dropped.jsonl",
        "manifest.json",
        "quarantine.jsonl",
        "report.json",
        "test-00000-of-00001.tfrecord",
        "tokenizers",
        "train-00000-of-00002.tfrecord",
        "train-00001-of-00002.tfrecord",
        "validation-00000-of-00001.tfrecord",
    ]
    assert leftovers(table.parent, "table") == []


def test_unknown_options_go_to_beam_and_change_nothing(table: Path, tmp_path: Path) -> None:
    spec = table.parent.parent / "table.yaml"
    out = tmp_path / "threaded"
    code = slipway(
        "data", "build", spec, "-o", out, "--direct_num_workers=2",
        "--direct_running_mode=multi_threading",
    )  # fmt: skip
    assert code == 0
    assert shard_hashes(out) == shard_hashes(table)


def test_existing_dataset_is_refused_without_overwrite(
    table: Path, table_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree_digest(table_copy)
    spec = table.parent.parent / "table.yaml"
    capsys.readouterr()
    assert slipway("data", "build", spec, "-o", table_copy) == 2
    error = one_line(capsys.readouterr().err)
    assert str(table_copy) in error and "--overwrite" in error
    assert tree_digest(table_copy) == before
    assert leftovers(table_copy.parent, "table") == []


def test_overwrite_replaces_the_dataset(table_copy: Path, tmp_path: Path) -> None:
    spec = write_tabular_dataset_inputs(tmp_path / "raw", "table", tabular_rows(150, seed=9))
    assert slipway("data", "build", spec, "-o", table_copy, "--overwrite") == 0
    manifest = load_manifest(table_copy)
    assert sum(split.num_records for split in manifest.splits.values()) == 150
    assert leftovers(table_copy.parent, "table") == []
    assert slipway("data", "validate", table_copy) == 0


def something_precious(path: Path, kind: str) -> None:
    if kind == "folder":
        path.mkdir()
        (path / "thesis.txt").write_text("years of work", encoding="utf-8")
    else:
        path.write_text("id,x\n1,2\n", encoding="utf-8")


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_overwrite_only_ever_replaces_a_dataset(table: Path, tmp_path: Path, kind: str) -> None:
    target = tmp_path / "precious"
    something_precious(target, kind)
    before = tree_digest(tmp_path)
    code = slipway("data", "build", table.parent.parent / "table.yaml", "-o", target, "--overwrite")
    assert code == 2
    assert tree_digest(tmp_path) == before
    assert leftovers(tmp_path, "precious") == []


def fail_on_validation_shard(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make shard writing fail part-way: other splits' shards are written first or after."""
    write_shard = shards.write_shard

    def failing(directory: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("validation-"):
            raise OSError(28, "No space left on device")
        return write_shard(directory, name, *args, **kwargs)

    monkeypatch.setattr(shards, "write_shard", failing)


def test_a_build_failing_part_way_leaves_nothing_behind(
    table: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_on_validation_shard(monkeypatch)
    spec = load_spec(table.parent.parent / "table.yaml")
    with pytest.raises(Exception, match="No space left on device"):
        build_dataset(spec, tmp_path / "fresh")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_overwrite_keeps_the_existing_dataset(
    table_copy: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("SLIPWAY_CRASH_DIR", str(tmp_path / "crashes"))
    before = tree_digest(table_copy)
    fail_on_validation_shard(monkeypatch)
    spec = write_tabular_dataset_inputs(tmp_path / "raw", "table", tabular_rows(150, seed=9))
    assert slipway("data", "build", spec, "-o", table_copy, "--overwrite") == EXIT_INTERNAL
    assert "the system refused: [Errno 28] No space left on device" in capsys.readouterr().err
    assert tree_digest(table_copy) == before
    assert leftovers(table_copy.parent, "table") == []
    assert slipway("data", "validate", table_copy) == 0


def test_a_source_gone_before_the_build_changes_nothing(table_copy: Path, tmp_path: Path) -> None:
    before = tree_digest(table_copy)
    spec_path = write_tabular_dataset_inputs(tmp_path / "raw", "table", tabular_rows(50, seed=3))
    spec = load_spec(spec_path)
    (tmp_path / "raw" / "table.csv").unlink()
    with pytest.raises(ConfigError, match=r"sources\.0\.path"):
        build_dataset(spec, table_copy, overwrite=True)
    assert tree_digest(table_copy) == before
    assert leftovers(table_copy.parent, "table") == []


# --------------------------------------------------------------------------- validate


def test_an_intact_dataset_validates(table: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = validate_json(capsys, table)
    assert code == 0
    assert report["ok"] and report["problems"] == [] and report["drifts"] == []


def test_a_tampered_shard_fails_validation_naming_the_shard(
    table_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shard = table_copy / "train-00001-of-00002.tfrecord"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    code, report = validate_json(capsys, table_copy)
    assert code == 1
    assert not report["ok"]
    errors = [p for p in report["problems"] if p["severity"] == "error"]
    assert {p["check"] for p in errors} >= {"shard.checksum", "shard.unreadable"}
    assert all("train-00001-of-00002.tfrecord" in p["message"] for p in errors)
    assert slipway("data", "validate", table_copy) == 1
    assert "FAILED" in capsys.readouterr().out


@pytest.fixture(scope="module")
def drifted(table: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same table, with ``x`` moved by five standard deviations and mostly red."""
    raw = tmp_path_factory.mktemp("drifted")
    rows = tabular_rows(TABLE_ROWS, seed=2, shift=10.0, colour_weights=(8.0, 1.0, 1.0))
    spec = write_tabular_dataset_inputs(raw, "table", rows)
    assert slipway("data", "build", spec, "-o", raw / "table") == 0
    return raw / "table"


def test_drift_against_a_reference_is_flagged(
    table: Path, drifted: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = validate_json(capsys, drifted, "--reference", table)
    assert code == 1
    assert report["problems"] == []
    checks = {(drift["feature"], drift["check"]) for drift in report["drifts"]}
    assert ("x", "numeric.mean_shift") in checks
    assert ("colour", "categorical.linf") in checks
    shift = next(d for d in report["drifts"] if d["check"] == "numeric.mean_shift")
    assert 4.0 < shift["value"] < 6.0


def test_a_dataset_against_itself_shows_no_drift(
    table: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = validate_json(capsys, table, "--reference", table)
    assert code == 0
    assert report["drifts"] == []


def test_another_sample_of_the_same_distribution_shows_no_drift(
    table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_tabular_dataset_inputs(tmp_path, "table", tabular_rows(TABLE_ROWS, seed=4))
    assert slipway("data", "build", spec, "-o", tmp_path / "table") == 0
    code, report = validate_json(capsys, tmp_path / "table", "--reference", table)
    assert report["drifts"] == []
    assert code == 0


# --------------------------------------------------------------------------- errors, show, help


def test_a_missing_spec_file_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert slipway("data", "build", "nowhere.yaml") == 2
    captured = capsys.readouterr()
    assert one_line(captured.err) == "error: nowhere.yaml: file not found"
    assert list(tmp_path.iterdir()) == []


SPEC_START = """\
name: table
sources:
  - type: csv
    path: table.csv
"""
SPEC_WITH_MISTAKES = {  # YAML added after SPEC_START -> what the error must say
    "unknown key": (
        "dedup:\n  exact:\n    feilds: [id]\n",
        "bad.yaml:7: dedup.exact.feilds: unknown key",
    ),
    "bad value": (
        "output:\n  compression: zip\n",
        "bad.yaml:6: output.compression: expected one of 'none' or 'gzip', got 'zip'",
    ),
    "unknown source type": (
        "  - type: parquet\n    path: table.csv\n",
        "bad.yaml:5: sources.1: Input tag 'parquet'",
    ),
}


@pytest.mark.parametrize("mistake", sorted(SPEC_WITH_MISTAKES))
def test_an_invalid_spec_names_file_line_and_key(
    mistake: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mistake_yaml, expected = SPEC_WITH_MISTAKES[mistake]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "table.csv").write_text("id\n1\n", encoding="utf-8")
    (tmp_path / "bad.yaml").write_text(SPEC_START + mistake_yaml, encoding="utf-8")
    assert slipway("data", "build", "bad.yaml") == 2
    error = one_line(capsys.readouterr().err)
    assert expected in error
    assert "Traceback" not in error
    assert not (tmp_path / "datasets").exists()


def test_a_spec_naming_an_unknown_field_is_refused_before_the_build(
    table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = table.parent.parent / "table.yaml"
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(
        spec.read_text(encoding="utf-8").replace("- colour", "- color"), encoding="utf-8"
    )
    shutil.copy(spec.parent / "table.csv", tmp_path / "table.csv")
    assert slipway("data", "build", wrong, "-o", tmp_path / "out") == 2
    assert "labels: unknown field 'color'" in one_line(capsys.readouterr().err)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["table.csv", "wrong.yaml"]


def test_show_summarises_features_and_splits(
    table: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert slipway("data", "show", table) == 0
    out = capsys.readouterr().out
    manifest = load_manifest(table)
    for name in ("id", "x", "colour (label)", "note", "numeric", "categorical", "text"):
        assert name in out
    assert "3 categories" in out
    for name, split in manifest.splits.items():
        assert name in out
        assert f"{split.num_records:,}" in out


def test_show_prints_each_features_statistics_and_the_first_records_as_stored(
    table: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import tensorflow as tf

    from research.data.show import first_records, statistics_line

    manifest = load_manifest(table)
    x = manifest.feature_statistics("x")
    assert statistics_line(x) == (
        f"mean {x['mean']:.4g} ± {x['std']:.4g} in [{x['min']:.4g}, {x['max']:.4g}]; 0 missing"
    )
    colours = manifest.feature_statistics("colour")["frequencies"]
    top, count = next(iter(colours.items()))
    assert statistics_line(manifest.feature_statistics("colour")).startswith(
        f"3 distinct; most: {top} {count:,}"
    )
    assert statistics_line(manifest.feature_statistics("note")).startswith("length median ")

    records = list(first_records(str(table), manifest, "test", 3))
    shard = manifest.shard_paths(table, "test")[0]
    stored = tf.data.TFRecordDataset(shard, manifest.tfrecord_compression).take(3)
    ids = [tf.train.Example.FromString(r.numpy()).features.feature["id"] for r in stored]
    assert [record["id"] for record in records] == [str(i.int64_list.value[0]) for i in ids]
    assert set(records[0]) == set(manifest.features)
    assert len(list(first_records(str(table), manifest, "test", 10**6))) == (
        manifest.splits["test"].num_records
    )

    capsys.readouterr()
    assert slipway("data", "show", table, "--examples", "2", "--split", "test") == 0
    out = one_line(capsys.readouterr().out)
    assert "statistics (train)" in out
    assert "the first 2 records of 'test'" in out
    assert slipway("data", "show", table, "--examples", "2", "--split", "holdout") == 2
    assert "no split 'holdout'" in one_line(capsys.readouterr().err)


def test_show_of_a_directory_that_is_not_a_dataset_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert slipway("data", "show", tmp_path) == 2
    assert "not a dataset" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("kind", ["missing", "empty", "no manifest", "corrupt manifest"])
def test_validate_of_a_path_that_is_not_a_dataset_exits_2(
    table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    path = tmp_path / "ds"
    if kind != "missing":
        path.mkdir()
    if kind == "no manifest":
        (path / "train-00000-of-00001.tfrecord").write_bytes(b"")
    if kind == "corrupt manifest":
        (path / "manifest.json").write_text('{"format": ')
    capsys.readouterr()
    assert slipway("data", "validate", path) == 2
    assert "manifest" in one_line(capsys.readouterr().out)  # what is missing or unreadable
    code, report = validate_json(capsys, path)
    assert code == 2 and report["not_datasets"] == [str(path)] and not report["ok"]
    code, report = validate_json(capsys, table, "--reference", path)
    assert code == 2 and report["not_datasets"] == [str(path)]


def test_validate_of_a_dataset_lists_no_path_as_not_a_dataset(
    table: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = validate_json(capsys, table, "--reference", table)
    assert (code, report["not_datasets"]) == (0, [])


def test_build_refuses_a_source_file_it_cannot_read_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A header that repeats a name, beside a good file: exit 2 naming the file, not a
    build that drops the file's rows and counts them as one lost input."""
    good = tabular_rows(100, seed=7)
    write_tabular_csv(tmp_path / "good.csv", good)
    bad = write_tabular_csv(tmp_path / "dup.csv", good)
    bad.write_text(bad.read_text().replace("id,x,colour,note", "id,x,colour,x", 1))
    spec = tabular_spec("dup", "good.csv")
    spec["sources"].append({"type": "csv", "path": "dup.csv"})
    spec["quality"] = {"max_quarantine_fraction": 0.01}
    path = write_spec(tmp_path / "dup.yaml", spec)
    capsys.readouterr()
    assert slipway("data", "build", path, "-o", tmp_path / "out") == 2
    error = one_line(capsys.readouterr().err)
    assert (
        f"{path}: sources.1: dup.csv:1: the header repeats 'x' (columns 2 and 4); give the "
        "columns unique names with names: [...]"
    ) in error
    assert not (tmp_path / "out").exists()


def test_build_refuses_hdf5_datasets_of_different_lengths_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import h5py
    import numpy as np

    with h5py.File(tmp_path / "wine.h5", "w") as handle:
        handle.create_dataset("measurements/features", data=np.zeros((178, 13)))
        handle.create_dataset("short", data=np.zeros(100, dtype=np.int64))
    spec = {
        "name": "wine",
        "sources": [
            {
                "type": "hdf5",
                "path": "wine.h5",
                "fields": {"features": "/measurements/features", "target": "/short"},
            }
        ],
        "labels": ["target"],
    }
    path = write_spec(tmp_path / "wine.yaml", spec)
    capsys.readouterr()
    assert slipway("data", "build", path, "-o", tmp_path / "out") == 2
    assert "wine.h5: cannot use HDF5 file: arrays must share their first dimension, got " in (
        one_line(capsys.readouterr().err)
    )


def test_image_builds_name_skipped_files_and_write_the_same_quarantine_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for index in range(40):
        image = Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8))
        path = tmp_path / "pets" / ("cat", "dog")[index % 2] / f"{index}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path)
    gif = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).save(gif, format="GIF")
    (tmp_path / "pets" / "cat" / "moving.gif").write_bytes(gif.getvalue())
    (tmp_path / "pets" / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff corrupt")
    (tmp_path / "pets" / "dog" / "notes.txt").write_text("not an image")
    spec = {"name": "pets", "sources": [{"type": "image_folder", "path": "pets"}]}
    spec["labels"] = ["label"]
    path = write_spec(tmp_path / "pets.yaml", spec)
    logs = []
    for out in ("one", "two"):
        capsys.readouterr()
        assert slipway("data", "build", path, "-o", tmp_path / out) == 0
        assert (
            "note: sources.0: pets: 1 file(s) skipped, not <class>/*.{gif|jpeg|jpg|png} "
            "images: dog/notes.txt"
        ) in one_line(capsys.readouterr().err)
        logs.append((tmp_path / out / "quarantine.jsonl").read_bytes())
        report = json.loads((tmp_path / out / "report.json").read_text())
        rules = {rule["rule"]: rule["count"] for rule in report["rules"]}
        assert rules["read.skipped_files"] == 1
        assert rules["read.records.image_folder"] == 42  # the GIF is read
    assert logs[0] == logs[1]
    (entry,) = [json.loads(line) for line in logs[0].splitlines()]
    assert entry["origin"] == "pets/dog/broken.jpg"
    assert " at 0x" not in entry["reason"]


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def leaf_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple]:
    children = subcommands(parser)
    if not children:
        return [prefix]
    return [
        leaf for name, child in children.items() for leaf in leaf_commands(child, (*prefix, name))
    ]


def test_help_lists_only_commands_that_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        slipway("--help")
    assert exit_info.value.code == 0
    listed = capsys.readouterr().out
    commands = subcommands(build_parser())
    assert {"data"} <= set(commands)
    listed_names = set(re.findall(r"^ {4}(\S+)", listed, flags=re.MULTILINE))
    assert listed_names == set(commands)
    missing = tmp_path / "missing.yaml"
    for leaf in leaf_commands(build_parser()):
        # Every command loads its modules and turns a missing input into a clean exit.
        try:
            code = slipway(*leaf, missing)
        except SystemExit as exc:  # argparse: the command wants more than one path
            code = exc.code
        error = capsys.readouterr().err
        assert code in (1, 2), leaf
        assert "Traceback" not in error


def test_tables_written_to_a_pipe_keep_every_column(
    table: Path,
    drifted: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Captured output is not a terminal, as a pipe is not; the console is made afresh the
    # way the command makes it, in an environment that does not name a width.
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(data_cli, "console", Console())
    capsys.readouterr()
    code = slipway("data", "validate", drifted, "--reference", table)
    piped = capsys.readouterr()
    assert code == 1, piped.err  # the drift is reported, in full
    lines = piped.out.splitlines()
    assert max(map(len, lines)) > 80, "the table fits 80 columns: it proves nothing here"
    assert not any("…" in line for line in lines), piped.out


def test_a_csv_file_with_only_its_header_is_named_beside_good_files_and_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file that adds nothing is named with the fix, whether the build passes or not."""
    write_tabular_csv(tmp_path / "tables" / "monday.csv", tabular_rows(60, seed=2))
    write_tabular_csv(tmp_path / "tables" / "sunday.csv", [])
    both = write_spec(tmp_path / "both.yaml", tabular_spec("both", "tables/*.csv"))
    capsys.readouterr()
    assert slipway("data", "build", str(both), "--output", str(tmp_path / "both")) == 0
    note = one_line(capsys.readouterr().err)
    assert (
        "note: sources.0: tables/sunday.csv: a header row and no data rows, so it adds no "
        "records; add its rows, or remove it or leave it out of the path" in note
    )
    assert "monday.csv" not in note
    assert load_manifest(tmp_path / "both").splits["train"].num_records > 0
    report = json.loads((tmp_path / "both" / "report.json").read_text())
    assert [n.split(":")[1].strip() for n in report["notes"]] == ["tables/sunday.csv"]

    alone = write_spec(tmp_path / "alone.yaml", tabular_spec("alone", "tables/sunday.csv"))
    assert slipway("data", "build", str(alone), "--output", str(tmp_path / "alone")) == 3
    error = one_line(capsys.readouterr().err)
    assert "tables/sunday.csv: a header row and no data rows" in error
    assert "the sources held no records at all" in error
    assert not (tmp_path / "alone").exists()
