"""Readers of every source type, file matching, sampling and the Beam read transform."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from PIL import Image

from contracts.yaml_config import ConfigError
from research.data import sources
from research.data.reading import UnreadableEntry
from research.data.records import METRICS_NAMESPACE, ORIGIN, QUARANTINE_TAG, RANK
from research.data.runners import IN_PROCESS_RUNNER as FN_API_RUNNER
from research.data.schema import resolve_schema
from research.data.sources import (
    ReadSources,
    check_sources,
    sample_records,
    source_columns,
    source_notes,
)
from research.data.spec import DatasetSpec
from tests.support.source_records import public, read


def make_spec(base: Path, *sources: dict[str, Any], **extra: Any) -> DatasetSpec:
    return DatasetSpec.model_validate(
        {"name": "t", "sources": list(sources), "base_dir": str(base), **extra}
    )


def png_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def jpeg_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG")
    return buffer.getvalue()


# --- CSV ------------------------------------------------------------------------------


def test_csv_keeps_strings_handles_quoted_newlines_and_renames(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text(
        'id,Comment,score\n1,"first line\nsecond line",0.5\n2,,7\n', encoding="utf-8"
    )
    spec = make_spec(tmp_path, {"type": "csv", "path": "a.csv", "rename": {"Comment": "text"}})
    records, quarantined = read(spec)
    assert quarantined == []
    assert [public(r) for r in records] == [
        {"id": "1", "text": "first line\nsecond line", "score": "0.5"},
        {"id": "2", "text": None, "score": "7"},
    ]
    # A row's origin is the line where it starts, even after a row spanning two lines.
    assert [r[ORIGIN] for r in records] == ["a.csv:2", "a.csv:4"]


def test_csv_broken_rows_are_quarantined_and_reading_goes_on(tmp_path: Path) -> None:
    (tmp_path / "b.csv").write_bytes(b'a,b\n1,2\n3\n"x"y,4\n5,6,7\n\xff\xfe,8\n9,10\n')
    spec = make_spec(tmp_path, {"type": "csv", "path": "b.csv"})
    records, quarantined = read(spec)
    assert [public(r) for r in records] == [{"a": "1", "b": "2"}, {"a": "9", "b": "10"}]
    assert [q["origin"] for q in quarantined] == ["b.csv:3", "b.csv:4", "b.csv:5", "b.csv:6"]
    reasons = [q["reason"] for q in quarantined]
    assert reasons[0] == "expected 2 columns, got 1"
    assert reasons[1].startswith("malformed CSV row:")
    assert reasons[2] == "expected 2 columns, got 3"
    assert reasons[3] == "row is not valid UTF-8"
    assert all(q["stage"] == "read" for q in quarantined)


def test_csv_files_whose_columns_cannot_be_known_are_refused_before_the_build(
    tmp_path: Path,
) -> None:
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "dup.csv").write_text("a,b\n1,2\n")
    cases = [
        (
            {"type": "csv", "path": "empty.csv"},
            "sources.0: empty.csv: empty file: a header row "
            "is required; remove the file or leave it out of the path",
        ),
        (
            {"type": "csv", "path": "empty.csv", "header": "none", "names": ["a"]},
            "sources.0: empty.csv: empty file: no rows; remove the file or leave it out of the path",
        ),
        (
            {"type": "csv", "path": "dup.csv", "rename": {"b": "a"}},
            "sources.0: dup.csv:1: rename gives 'a' (columns 1 and 2); rename them to different "
            "names",
        ),
    ]
    for source, message in cases:
        with pytest.raises(ConfigError) as raised:
            source_columns(make_spec(tmp_path, source))
        assert str(raised.value) == message


def test_a_csv_file_unreadable_at_build_time_ends_with_one_unreadable_entry(
    tmp_path: Path,
) -> None:
    """A file that changed after the checks: the reader says so, never a record count."""
    (tmp_path / "dup.csv").write_text("a,a\n1,2\n")
    records, quarantined = read(make_spec(tmp_path, {"type": "csv", "path": "dup.csv"}))
    assert records == []
    assert [type(q) for q in quarantined] == [UnreadableEntry]
    assert quarantined[0]["origin"] == "dup.csv:1"
    assert quarantined[0]["reason"].startswith("the header repeats 'a' (columns 1 and 2)")


def test_csv_honours_delimiter_and_byte_order_mark(tmp_path: Path) -> None:
    (tmp_path / "s.csv").write_bytes("\ufeffx;y\n1;2\n".encode())
    spec = make_spec(tmp_path, {"type": "csv", "path": "s.csv", "delimiter": ";"})
    records, _ = read(spec)
    assert [public(r) for r in records] == [{"x": "1", "y": "2"}]


# --- JSONL ----------------------------------------------------------------------------


def test_jsonl_reads_objects_and_quarantines_bad_lines(tmp_path: Path) -> None:
    lines = [
        json.dumps({"x": [1, 2, 3], "meta": {"k": 1}, "old": "v"}),
        "",
        "{not json",
        "[1, 2]",
        json.dumps({"x": [4, 5, 6]}),
    ]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    spec = make_spec(tmp_path, {"type": "jsonl", "path": "d.jsonl", "rename": {"old": "new"}})
    records, quarantined = read(spec)
    assert [public(r) for r in records] == [
        {"x": [1, 2, 3], "meta": {"k": 1}, "new": "v"},
        {"x": [4, 5, 6]},
    ]
    assert [r[ORIGIN] for r in records] == ["d.jsonl:1", "d.jsonl:5"]
    assert [(q["origin"], q["reason"].split(":")[0]) for q in quarantined] == [
        ("d.jsonl:3", "invalid JSON"),
        ("d.jsonl:4", "expected a JSON object, got list"),
    ]
    assert quarantined[0]["raw"] == "{not json\n"


# --- text -----------------------------------------------------------------------------


def test_text_line_mode_with_constant_label(tmp_path: Path) -> None:
    (tmp_path / "pos.txt").write_bytes(b"good film\n\n   \nfine \xe9 acting\r\nbad \xff byte\n")
    spec = make_spec(
        tmp_path,
        {"type": "text", "path": "pos.txt", "label": "pos", "label_field": "sentiment"},
    )
    records, quarantined = read(spec)
    assert [public(r) for r in records] == [{"text": "good film", "sentiment": "pos"}]
    assert [q["origin"] for q in quarantined] == ["pos.txt:4", "pos.txt:5"]
    assert quarantined[0]["reason"] == "line is not valid utf-8"
    assert "\\xe9" in quarantined[0]["raw"]


def test_text_line_mode_in_a_declared_encoding(tmp_path: Path) -> None:
    (tmp_path / "l1.txt").write_bytes("café\nnaïve\n".encode("latin-1"))
    spec = make_spec(tmp_path, {"type": "text", "path": "l1.txt", "encoding": "latin-1"})
    records, quarantined = read(spec)
    assert quarantined == []
    assert [r["text"] for r in records] == ["café", "naïve"]


def test_text_file_mode_one_document_per_file(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("line one\nline two\n")
    (docs / "b.txt").write_text("other")
    (docs / "blank.txt").write_text("\n \n")
    (docs / "bad.txt").write_bytes(b"ok \xff")
    spec = make_spec(
        tmp_path, {"type": "text", "path": "docs/*.txt", "mode": "file", "field": "body"}
    )
    records, quarantined = read(spec)
    assert [(r[ORIGIN], r["body"]) for r in records] == [
        ("docs/a.txt", "line one\nline two\n"),
        ("docs/b.txt", "other"),
    ]
    assert [(q["origin"], q["reason"]) for q in quarantined] == [
        ("docs/bad.txt", "file is not valid utf-8")
    ]


# --- image folder ---------------------------------------------------------------------


def test_image_folder_reads_raw_bytes_with_class_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    cat = png_bytes(rng.integers(0, 256, (6, 5, 3), dtype=np.uint8))
    dog = jpeg_bytes(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    corrupt = b"\x89PNG\r\n\x1a\n truncated"
    for name, data in [("cat/1.png", cat), ("dog/2.JPG", dog), ("dog/3.jpeg", corrupt)]:
        (tmp_path / "pets" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pets" / name).write_bytes(data)
    gif = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)).save(gif, format="GIF")
    (tmp_path / "pets" / "cat" / "4.gif").write_bytes(gif.getvalue())
    (tmp_path / "pets" / "dog" / "notes.txt").write_text("not an image")
    (tmp_path / "pets" / "README").write_text("not a class")
    (tmp_path / "pets" / "dog" / ".DS_Store").write_text("hidden: not counted")
    spec = make_spec(tmp_path, {"type": "image_folder", "path": "pets", "image_field": "photo"})
    records, quarantined = read(spec)
    assert quarantined == []
    assert [public(r) for r in records] == [
        {"photo": cat, "label": "cat"},
        {"photo": gif.getvalue(), "label": "cat"},
        {"photo": dog, "label": "dog"},
        {"photo": corrupt, "label": "dog"},  # decoding is checked when conforming
    ]
    assert [r[ORIGIN] for r in records] == [
        "pets/cat/1.png",
        "pets/cat/4.gif",
        "pets/dog/2.JPG",
        "pets/dog/3.jpeg",
    ]
    assert source_notes(spec) == [
        "sources.0: pets: 2 file(s) skipped, not <class>/*.{gif|jpeg|jpg|png} images: "
        "README, dog/notes.txt"
    ]


def test_files_an_image_folder_skips_are_counted_in_beam(tmp_path: Path) -> None:
    for name in ("a/1.png", "a/2.txt", "b/3.bmp", "b/4.png", "top.csv"):
        (tmp_path / "pets" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pets" / name).write_bytes(b"x")
    spec = make_spec(tmp_path, {"type": "image_folder", "path": "pets"})
    assert run_counters(spec) == {"read.records.image_folder": 2, "read.skipped_files": 3}


def test_image_folder_without_images_is_refused_before_the_build(tmp_path: Path) -> None:
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    (tmp_path / "empty" / "cls" / "a.tiff").write_bytes(b"x")
    spec = make_spec(tmp_path, {"type": "image_folder", "path": "empty"})
    with pytest.raises(ConfigError) as raised:
        source_columns(spec)
    assert str(raised.value) == (
        "sources.0: empty: no images: expected <class>/*.{gif|jpeg|jpg|png} under the "
        "folder; it holds only 1 other file(s): cls/a.tiff"
    )
    records, quarantined = read(spec)  # had it changed after the check: one unreadable entry
    assert records == []
    assert [type(q) for q in quarantined] == [UnreadableEntry]
    assert quarantined[0]["reason"].startswith("no images")


# --- npz ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    images = np.round(data.images[:50] * (255 / 16)).astype(np.uint8)
    return images, data.target[:50]


def test_npz_digits_one_record_per_index_with_png_images(tmp_path: Path, digits) -> None:
    images, target = digits
    np.savez(tmp_path / "digits.npz", images=images, target=target)
    spec = make_spec(
        tmp_path,
        {
            "type": "npz",
            "path": "digits.npz",
            "arrays": {"images": "image", "target": "label"},
            "images": ["image"],
        },
    )
    records, quarantined = read(spec)
    assert quarantined == []
    assert len(records) == len(images)
    for index, record in enumerate(records):
        assert type(record["label"]) is int and record["label"] == target[index]
        decoded = np.asarray(Image.open(io.BytesIO(record["image"])))
        np.testing.assert_array_equal(decoded, images[index])
    assert records[3][ORIGIN] == "digits.npz[3]"


def test_npz_all_arrays_by_default_rows_become_lists(tmp_path: Path) -> None:
    np.savez(
        tmp_path / "v.npz", x=np.arange(6, dtype=np.float32).reshape(3, 2), y=np.array([1, 0, 1])
    )
    spec = make_spec(tmp_path, {"type": "npz", "path": "v.npz"})
    records, _ = read(spec)
    assert [public(r) for r in records] == [
        {"x": [0.0, 1.0], "y": 1},
        {"x": [2.0, 3.0], "y": 0},
        {"x": [4.0, 5.0], "y": 1},
    ]


def test_npz_integral_float_images_are_accepted(tmp_path: Path) -> None:
    pixels = np.array([[[0.0, 255.0], [17.0, 3.0]]])
    np.savez(tmp_path / "f.npz", img=pixels)
    spec = make_spec(tmp_path, {"type": "npz", "path": "f.npz", "images": ["img"]})
    records, quarantined = read(spec)
    assert quarantined == []
    decoded = np.asarray(Image.open(io.BytesIO(records[0]["img"])))
    np.testing.assert_array_equal(decoded, pixels[0].astype(np.uint8))


@pytest.mark.parametrize(
    ("pixels", "reason"),
    [
        (
            np.full((2, 4, 4), 0.5),
            "images: field 'img' has dtype float64 with values that are not whole numbers",
        ),
        (np.full((2, 4, 4), 300), "not whole numbers in 0..255"),
    ],
)
def test_npz_images_that_cannot_be_used_are_quarantined_row_by_row(
    tmp_path: Path, pixels: np.ndarray, reason: str
) -> None:
    np.savez(tmp_path / "bad.npz", img=pixels)
    spec = make_spec(tmp_path, {"type": "npz", "path": "bad.npz", "images": ["img"]})
    records, quarantined = read(spec)
    assert records == []
    assert [entry["origin"] for entry in quarantined] == ["bad.npz[0]", "bad.npz[1]"]
    assert all(reason in entry["reason"] for entry in quarantined)


@pytest.mark.parametrize(
    ("arrays", "images", "reason"),
    [
        (
            {"a": np.zeros((3, 2)), "b": np.zeros(4)},
            [],
            "arrays must share their first dimension, got a (3), b (4)",
        ),
        ({"img": np.zeros((2, 4))}, ["img"], "images: field 'img' has shape [2, 4]"),
        ({"objs": np.array([{"a": 1}, None], dtype=object)}, [], "allow_pickle=False"),
    ],
)
def test_npz_unusable_files_are_quarantined_with_a_clear_reason(
    tmp_path: Path, arrays: dict, images: list[str], reason: str
) -> None:
    np.savez(tmp_path / "bad.npz", **arrays)
    spec = make_spec(tmp_path, {"type": "npz", "path": "bad.npz", "images": images})
    records, quarantined = read(spec)
    assert records == []
    assert len(quarantined) == 1
    assert quarantined[0]["origin"] == "bad.npz"
    assert reason in quarantined[0]["reason"]


@pytest.mark.parametrize(
    ("arrays", "images", "reason"),
    [
        (
            {"a": np.zeros((3, 2)), "b": np.zeros(4)},
            [],
            "arrays must share their first dimension, got a (3), b (4): row i of every array "
            "is record i, so list only arrays with one row per record",
        ),
        ({"img": np.zeros((2, 4))}, ["img"], "images: field 'img' has shape [2, 4]"),
        ({"objs": np.array([{"a": 1}, None], dtype=object)}, [], "allow_pickle=False"),
    ],
)
def test_npz_files_whose_arrays_do_not_fit_together_are_refused_before_the_build(
    tmp_path: Path, arrays: dict, images: list[str], reason: str
) -> None:
    np.savez(tmp_path / "bad.npz", **arrays)
    spec = make_spec(tmp_path, {"type": "npz", "path": "bad.npz", "images": images})
    with pytest.raises(ConfigError) as raised:
        source_columns(spec)
    assert str(raised.value).startswith("sources.0: bad.npz: cannot use npz file: ")
    assert reason in str(raised.value)


def test_a_file_that_is_no_npz_archive_is_refused_before_the_build(tmp_path: Path) -> None:
    (tmp_path / "fake.npz").write_text("not a zip")
    spec = make_spec(tmp_path, {"type": "npz", "path": "fake.npz"})
    with pytest.raises(ConfigError, match=r"^sources.0: fake.npz: cannot use npz file: "):
        source_columns(spec)


def test_hdf5_datasets_of_different_lengths_are_refused_before_the_build(tmp_path: Path) -> None:
    import h5py

    with h5py.File(tmp_path / "wine.h5", "w") as handle:
        handle.create_dataset("measurements/features", data=np.zeros((178, 13)))
        handle.create_dataset("short", data=np.zeros(100, dtype=np.int64))
    source = {
        "type": "hdf5",
        "path": "wine.h5",
        "fields": {"features": "/measurements/features", "target": "/short"},
    }
    for spec in (
        make_spec(tmp_path, source, labels=["target"]),
        make_spec(tmp_path, source, schema={"target": {"type": "categorical"}}),
    ):
        with pytest.raises(ConfigError) as raised:
            resolve_schema(spec)
        assert str(raised.value).startswith(
            "sources.0: wine.h5: cannot use HDF5 file: arrays must share their first "
            "dimension, got features (178), target (100)"
        )
    (tmp_path / "fake.h5").write_text("not hdf5")
    with pytest.raises(ConfigError, match=r"^sources.0: fake.h5: cannot use HDF5 file: "):
        source_columns(make_spec(tmp_path, {"type": "hdf5", "path": "fake.h5"}))


def test_npz_missing_array_names_the_arrays_present(tmp_path: Path) -> None:
    np.savez(tmp_path / "m.npz", x=np.zeros(2))
    spec = make_spec(tmp_path, {"type": "npz", "path": "m.npz", "arrays": {"X": "x"}})
    _, quarantined = read(spec)
    assert "no array named X (arrays: x)" in quarantined[0]["reason"]


def test_npz_array_missing_from_the_file_is_a_config_error_before_the_build(
    tmp_path: Path,
) -> None:
    from research.data.schema import resolve_schema

    np.savez(tmp_path / "m.npz", images=np.zeros((2, 2, 2)), target=np.zeros(2))
    spec = make_spec(tmp_path, {"type": "npz", "path": "m.npz", "arrays": {"image": "x"}})
    with pytest.raises(ConfigError) as raised:
        resolve_schema(spec)
    assert str(raised.value) == (
        "sources.0.arrays: m.npz: no array named image (arrays: images, target); "
        "did you mean 'images'?"
    )


# --- matching, ranks, sampling --------------------------------------------------------


def test_missing_path_or_empty_glob_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("x\n1\n")
    spec = make_spec(
        tmp_path,
        {"type": "csv", "path": "a.csv"},
        {"type": "jsonl", "path": "missing/*.jsonl"},
    )
    with pytest.raises(ConfigError, match=r"^sources\.1\.path: no such file or folder: .*missing"):
        check_sources(spec)


def test_folder_where_a_file_is_expected_and_unknown_encoding(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"^sources\.0\.path: .*dir is a folder, expected a file"):
        check_sources(make_spec(tmp_path, {"type": "csv", "path": "dir"}))
    with pytest.raises(ConfigError, match=r"^sources\.0\.encoding: unknown encoding 'nope'"):
        check_sources(make_spec(tmp_path, {"type": "text", "path": "t.txt", "encoding": "nope"}))


def test_globs_match_in_sorted_order_and_ranks_are_unique_and_ordered(tmp_path: Path) -> None:
    for name in ["b.jsonl", "a.jsonl", "c.txt"]:
        (tmp_path / name).write_text('{"v": 1}\n{"v": 2}\n')
    spec = make_spec(tmp_path, {"type": "jsonl", "path": "*.jsonl"})
    assert [unit.display for unit in check_sources(spec)] == ["a.jsonl", "b.jsonl"]
    records, _ = read(spec)
    ranks = [r[RANK] for r in records]
    assert len(set(ranks)) == 4
    assert ranks == sorted(ranks)
    assert read(spec)[0] == records  # same input, same records


def test_sample_takes_records_from_every_source_in_turn(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("x\n" + "".join(f"{i}\n" for i in range(10)))
    (tmp_path / "b.txt").write_text("one\ntwo\n")
    spec = make_spec(tmp_path, {"type": "csv", "path": "a.csv"}, {"type": "text", "path": "b.txt"})
    sample = sample_records(spec, 5)
    assert [public(r) for r in sample] == [
        {"x": "0"},
        {"text": "one"},
        {"x": "1"},
        {"text": "two"},
        {"x": "2"},
    ]


# --- Beam -----------------------------------------------------------------------------


def run_counters(spec: DatasetSpec, **transform: Any) -> dict[str, int]:
    """The counters of a pipeline that only reads ``spec``'s sources."""
    pipeline = TestPipeline(runner=FN_API_RUNNER)
    _ = pipeline | ReadSources(spec, **transform)
    run = pipeline.run()
    run.wait_until_finish()
    return {
        c.key.metric.name: c.committed
        for c in run.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]
    }


def test_a_file_unreadable_when_the_build_reads_it_is_counted_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Passed the checks, then changed: counted so that the build refuses (quality)."""
    (tmp_path / "a.csv").write_text("x,y\n1,2\n")
    (tmp_path / "b.csv").write_text("x,x\n1,2\n3,4\n")
    spec = make_spec(tmp_path, {"type": "csv", "path": "*.csv"})
    assert run_counters(spec) == {
        "read.records.csv": 1,
        "read.quarantined": 1,
        "read.unreadable_files": 1,
    }

    def vanishing(unit: Any) -> Any:
        yield from ()
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setitem(sources._READERS, "csv", sources._Reader(vanishing, lambda unit: []))
    assert run_counters(spec) == {"read.quarantined": 2, "read.unreadable_files": 2}


def test_read_sources_in_beam_splits_records_from_quarantine_and_counts(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("x,y\n1,2\n3\n")
    (tmp_path / "b.jsonl").write_text('{"x": "4"}\nnope\n')
    spec = make_spec(
        tmp_path, {"type": "csv", "path": "a.csv"}, {"type": "jsonl", "path": "b.jsonl"}
    )
    pipeline = TestPipeline(runner=FN_API_RUNNER)
    result = pipeline | ReadSources(spec)
    assert_that(
        result.records | beam.Map(public),
        equal_to([{"x": "1", "y": "2"}, {"x": "4"}]),
        label="records",
    )
    assert_that(
        result[QUARANTINE_TAG] | beam.Map(lambda q: q["origin"]),
        equal_to(["a.csv:3", "b.jsonl:2"]),
        label="quarantine",
    )
    run = pipeline.run()
    run.wait_until_finish()
    counters = {
        c.key.metric.name: c.committed
        for c in run.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]
    }
    assert counters == {"read.records.csv": 1, "read.records.jsonl": 1, "read.quarantined": 2}


def test_jsonl_lone_surrogates_are_quarantined_not_crashed(tmp_path):
    from research.data.sources import _read_jsonl, check_sources
    from research.data.spec import load_spec

    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "bad \\udc80 half"}\n{"t\\ud800": 1}\n')
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text("name: s\nsources:\n  - {type: jsonl, path: data.jsonl}\n")

    (unit,) = check_sources(load_spec(spec_path))
    items = list(_read_jsonl(unit))
    assert items[0]["text"] == "ok"
    assert [item["reason"] for item in items[1:]] == [
        "invalid JSON string: an unpaired \\u surrogate escape is not text"
    ] * 2
