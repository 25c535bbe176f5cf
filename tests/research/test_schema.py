"""Schema inference, resolution against the spec, and conformance of records."""

from __future__ import annotations

import io
import json
import math
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
from research.data.inference import infer_schema
from research.data.records import METRICS_NAMESPACE, ORIGIN, QUARANTINE_TAG, RANK, TABLE_DIR
from research.data.runners import IN_PROCESS_RUNNER as FN_API_RUNNER
from research.data.schema import (
    ConformError,
    ConformToSchema,
    conform_record,
    conform_value,
    resolve_schema,
)
from research.data.sources import ReadSources
from research.data.spec import DatasetSpec, FieldSchema


def make_spec(base: Path, *sources: dict[str, Any], **extra: Any) -> DatasetSpec:
    return DatasetSpec.model_validate(
        {"name": "t", "sources": list(sources), "base_dir": str(base), **extra}
    )


def inferred(spec: DatasetSpec, **options: Any) -> dict[str, FieldSchema]:
    """The inferred fields without the reasons."""
    return {name: guess.field for name, guess in infer_schema(spec, **options).items()}


def encode(image: Image.Image, image_format: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=image_format)
    return buffer.getvalue()


def gray(height: int, width: int, value: int = 0) -> Image.Image:
    return Image.fromarray(np.full((height, width), value, dtype=np.uint8))


def rgb(height: int, width: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)))


def write_images(root: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


# --- inference ------------------------------------------------------------------------


@pytest.fixture
def table(tmp_path: Path) -> Path:
    colors = ["red", "green", "blue"]
    rows = ["count,price,zip,color,review,uid,klass,target"]
    for i in range(30):
        rows.append(
            f"{i},{i + 0.5},0{2100 + i % 3},{colors[i % 3]},"
            f'"a fine review number {i}",u{i},{i % 2},{i / 10}'
        )
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    return tmp_path


def test_infer_types_from_csv_strings(table: Path) -> None:
    spec = make_spec(table, {"type": "csv", "path": "t.csv"}, labels=["klass", "target"])
    schema = inferred(spec)
    assert list(schema) == ["count", "price", "zip", "color", "review", "uid", "klass", "target"]
    assert {name: (f.type, f.dtype) for name, f in schema.items()} == {
        "count": ("numeric", "int64"),
        "price": ("numeric", "float32"),
        "zip": ("categorical", "float32"),  # leading zeros: an identifier, not a number
        "color": ("categorical", "float32"),
        "review": ("text", "float32"),  # whitespace
        "uid": ("text", "float32"),  # nearly all distinct
        "klass": ("categorical", "float32"),  # integer label: class ids
        "target": ("numeric", "float32"),  # float label: regression
    }


def test_without_label_integers_stay_numeric_and_short_string_labels_are_classes(
    tmp_path: Path,
) -> None:
    (tmp_path / "d.jsonl").write_text(
        "\n".join(json.dumps({"n": i % 3, "name": f"item {i}", "tag": f"t{i}"}) for i in range(3))
    )
    plain = inferred(make_spec(tmp_path, {"type": "jsonl", "path": "d.jsonl"}))
    assert (plain["n"].type, plain["name"].type) == ("numeric", "text")
    labelled = inferred(
        make_spec(tmp_path, {"type": "jsonl", "path": "d.jsonl"}, labels=["n", "name"])
    )
    assert (labelled["n"].type, labelled["name"].type) == ("categorical", "categorical")


def test_infer_numeric_vectors(tmp_path: Path) -> None:
    lines = [{"ints": [1, 2, 3], "floats": [0.5, 1, 2]}, {"ints": [4, 5, 6], "floats": None}]
    (tmp_path / "v.jsonl").write_text("\n".join(json.dumps(line) for line in lines))
    schema = inferred(make_spec(tmp_path, {"type": "jsonl", "path": "v.jsonl"}))
    assert schema["ints"] == FieldSchema(type="numeric", dtype="int64", shape=[3])
    assert schema["floats"] == FieldSchema(type="numeric", dtype="float32", shape=[3])


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ([[1, 2], [1, 2, 3]], "its lists have different lengths (2 and 3)"),
        ([[1, "a"]], "its lists hold values that are not numbers"),
        ([[1], 2], "its values mix list, number"),
        ([None, None], "it has no values in the 2 sampled records"),
        ([{"a": 1}], "nested objects are not supported"),
    ],
)
def test_fields_that_cannot_be_inferred_are_config_errors(
    tmp_path: Path, values: list[Any], problem: str
) -> None:
    (tmp_path / "v.jsonl").write_text("\n".join(json.dumps({"f": value}) for value in values))
    spec = make_spec(tmp_path, {"type": "jsonl", "path": "v.jsonl"})
    with pytest.raises(ConfigError) as raised:
        inferred(spec)
    assert str(raised.value) == (
        f"schema.f: cannot infer the field's type: {problem}; declare it under schema"
    )
    # Declaring the field is the way out.
    declared = make_spec(
        tmp_path, {"type": "jsonl", "path": "v.jsonl"}, schema={"f": {"type": "text"}}
    )
    assert inferred(declared) == {}


def test_infer_image_from_first_decodable_image(tmp_path: Path) -> None:
    palette_gray = gray(7, 9).convert("P")
    write_images(
        tmp_path,
        {
            "gray/a/0.png": b"not an image",
            "gray/a/1.png": encode(gray(5, 6)),
            "color/a/1.jpg": encode(rgb(4, 3), "JPEG"),
            "palette/a/1.png": encode(palette_gray),
        },
    )
    for folder, expected in [("gray", (5, 6, 1)), ("color", (4, 3, 3)), ("palette", (7, 9, 1))]:
        schema = inferred(make_spec(tmp_path, {"type": "image_folder", "path": folder}))
        image = schema["image"]
        assert (image.type, image.height, image.width, image.channels) == ("image", *expected)
        assert schema["label"].type == "categorical"


def test_no_decodable_image_is_a_config_error(tmp_path: Path) -> None:
    write_images(tmp_path, {"imgs/a/1.png": b"junk", "imgs/b/2.png": b"more junk"})
    with pytest.raises(ConfigError, match="none of its 2 sampled images can be decoded"):
        inferred(make_spec(tmp_path, {"type": "image_folder", "path": "imgs"}))


def test_infer_schema_of_npz_digits(tmp_path: Path) -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.round(digits.images[:40] * (255 / 16)).astype(np.uint8)
    np.savez(tmp_path / "digits.npz", image=images, label=digits.target[:40])
    spec = make_spec(
        tmp_path, {"type": "npz", "path": "digits.npz", "images": ["image"]}, labels=["label"]
    )
    schema = inferred(spec, sample_size=10)
    assert schema == {
        "image": FieldSchema(type="image", height=8, width=8, channels=1),
        "label": FieldSchema(type="categorical"),
    }


def write_measurements(directory: Path, cells: dict[int, str], rows: int = 100) -> None:
    """``m.csv``: ``size`` holds i + 0.5 in row i, except the ``cells`` given."""
    lines = ["size,kind"] + [f"{cells.get(i, i + 0.5)},k{i % 3}" for i in range(rows)]
    (directory / "m.csv").write_text("\n".join(lines) + "\n")


def test_a_missing_marker_in_a_numeric_column_is_missing_not_a_category(tmp_path: Path) -> None:
    write_measurements(tmp_path, {12: "n/a"})
    guesses = infer_schema(make_spec(tmp_path, {"type": "csv", "path": "m.csv"}))
    assert guesses["size"].field == FieldSchema(type="numeric", dtype="float32")
    assert guesses["size"].why == (
        "numeric float32: all 99 sampled values are numbers; 1 of 100 sampled records lack it"
    )


def test_a_few_unparseable_cells_keep_a_column_numeric_and_are_quarantined(
    tmp_path: Path,
) -> None:
    write_measurements(tmp_path, {11: "abc"})
    guesses = infer_schema(make_spec(tmp_path, {"type": "csv", "path": "m.csv"}))
    assert guesses["size"].field == FieldSchema(type="numeric", dtype="float32")
    assert guesses["size"].why == (
        "numeric float32: 99 of 100 sampled values are numbers; "
        "1 unparseable cell ('abc' at m.csv:13) quarantined with its record"
    )
    with pytest.raises(ConformError, match=r"^field 'size': expected numeric float32, got 'abc'"):
        conform_record({"size": "abc", "kind": "k1"}, {"size": guesses["size"].field})


def test_more_unparseable_cells_than_the_limit_make_a_column_of_strings(
    tmp_path: Path,
) -> None:
    write_measurements(tmp_path, {3: "abc", 40: "big", 77: "small"})
    guesses = infer_schema(make_spec(tmp_path, {"type": "csv", "path": "m.csv"}))
    assert guesses["size"].field.type == "text"  # nearly every value distinct
    assert "3 of 100 sampled values are not numbers (more than 2%), e.g. 'abc'" in (
        guesses["size"].why
    )


# --- resolution -----------------------------------------------------------------------


def test_declared_fields_override_and_come_first(table: Path) -> None:
    spec = make_spec(
        table,
        {"type": "csv", "path": "t.csv"},
        schema={"target": {"type": "numeric"}, "count": {"type": "numeric", "dtype": "float32"}},
    )
    schema = resolve_schema(spec).fields
    assert list(schema) == ["target", "count", "price", "zip", "color", "review", "uid", "klass"]
    assert schema["count"].dtype == "float32"
    assert resolve_schema(spec).fields == schema


def test_without_inference_only_declared_fields(table: Path) -> None:
    spec = make_spec(
        table,
        {"type": "csv", "path": "t.csv"},
        schema={"review": {"type": "text"}},
        infer_schema=False,
    )
    assert resolve_schema(spec).fields == {"review": FieldSchema(type="text")}
    empty = make_spec(table, {"type": "csv", "path": "t.csv"}, infer_schema=False)
    with pytest.raises(ConfigError, match="no fields are declared and infer_schema is false"):
        resolve_schema(empty)


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"labels": ["lable"]}, "labels"),
        ({"clean": {"required": ["lable"]}}, "clean.required"),
        ({"clean": {"length": {"lable": {"min": 1}}}}, "clean.length"),
        ({"clean": {"pii": {"fields": ["lable"]}}}, "clean.pii.fields"),
        ({"split": {"key": "lable"}}, "split.key"),
        ({"dedup": {"near": {"field": "lable"}}}, "dedup.near.field"),
        ({"dedup": {"exact": {"fields": ["lable"]}}}, "dedup.exact.fields"),
        ({"vocab": {"fields": ["lable"]}}, "vocab.fields"),
    ],
)
def test_unknown_field_names_the_spec_key(
    tmp_path: Path, section: dict[str, Any], key: str
) -> None:
    write_images(tmp_path, {"imgs/cat/1.png": encode(gray(2, 2))})
    spec = make_spec(tmp_path, {"type": "image_folder", "path": "imgs"}, **section)
    with pytest.raises(ConfigError) as raised:
        resolve_schema(spec)
    assert str(raised.value) == (
        f"{key}: unknown field 'lable' (fields: image, label); did you mean 'label'?"
    )


def test_text_only_settings_refuse_other_field_types(tmp_path: Path) -> None:
    write_images(tmp_path, {"imgs/cat/1.png": encode(gray(2, 2))})
    spec = make_spec(
        tmp_path, {"type": "image_folder", "path": "imgs"}, vocab={"fields": ["label"]}
    )
    with pytest.raises(ConfigError, match="^vocab.fields: field 'label' is categorical, expected"):
        resolve_schema(spec)


# --- conformance ----------------------------------------------------------------------

INT = FieldSchema(type="numeric", dtype="int64")
FLOAT = FieldSchema(type="numeric")
VECTOR = FieldSchema(type="numeric", shape=[3])
CATEGORY = FieldSchema(type="categorical")
TEXT = FieldSchema(type="text")


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        (INT, " 42 ", 42),
        (INT, "2.0", 2),
        (INT, 7.0, 7),
        (INT, True, 1),
        (FLOAT, "1e3", 1000.0),
        (FLOAT, 3, 3.0),
        (FLOAT, "nan", None),
        (FLOAT, "", None),
        (FLOAT, None, None),
        (VECTOR, [1, "2", 3.5], [1.0, 2.0, 3.5]),
        (CATEGORY, 3, "3"),
        (CATEGORY, 1.0, "1"),
        (CATEGORY, "cat", "cat"),
        (TEXT, "some words", "some words"),
        (TEXT, 12, "12"),
    ],
)
def test_conform_value_converts(field: FieldSchema, value: Any, expected: Any) -> None:
    result = conform_value("f", value, field)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (INT, "abc", "field 'f': expected numeric int64, got 'abc'"),
        (INT, 2.5, "field 'f': expected numeric int64, got 2.5 (not a whole number)"),
        (INT, 2**70, "out of int64 range"),
        (
            FLOAT,
            "inf",
            "field 'f': expected numeric float32, got 'inf' (not finite (inf); the field's non_finite: keep would keep it)",
        ),
        (FLOAT, "-Infinity", "(not finite (-inf); the field's non_finite: keep would keep it)"),
        (
            VECTOR,
            [1, float("inf"), 3],
            "(item 1: not finite (inf); the field's non_finite: keep would keep it)",
        ),
        (FLOAT, 1e300, "out of float32 range"),
        (FLOAT, [1.0], "field 'f': expected numeric float32, got [1.0]"),
        (VECTOR, [1, 2], "expected numeric float32 vector of length 3, got [1, 2] (length 2)"),
        (VECTOR, [1, "x", 3], "(item 1: not a number)"),
        (VECTOR, [1, float("nan"), 3], "(item 1: NaN; the field's non_finite: keep would keep it)"),
        (VECTOR, 5, "expected numeric float32 vector of length 3, got 5"),
        (CATEGORY, 1.5, "field 'f': expected categorical (string), got 1.5"),
        (TEXT, [1, 2], "field 'f': expected text (string), got [1, 2]"),
    ],
)
def test_conform_value_refuses_what_does_not_fit(
    field: FieldSchema, value: Any, message: str
) -> None:
    with pytest.raises(ConformError) as raised:
        conform_value("f", value, field)
    assert message in str(raised.value)
    assert raised.value.field == "f"


def test_non_finite_keep_keeps_infinities_and_nans_in_vectors_of_float_fields() -> None:
    keep = {"non_finite": "keep"}
    scalar = FieldSchema(type="numeric", **keep)
    vector = FieldSchema(type="numeric", shape=[3], **keep)
    assert conform_value("f", "inf", scalar) == float("inf")
    assert conform_value("f", "-Infinity", scalar) == float("-inf")
    assert conform_value("f", "nan", scalar) is None  # a scalar NaN is still "missing"
    kept = conform_value("f", [1, float("nan"), float("inf")], vector)
    assert kept[0] == 1.0 and math.isnan(kept[1]) and kept[2] == float("inf")
    with pytest.raises(ValueError, match="numeric float32 fields only"):
        FieldSchema(type="numeric", dtype="int64", **keep)
    with pytest.raises(ValueError, match="numeric float32 fields only"):
        FieldSchema(type="text", **keep)


def test_conform_record_keeps_schema_fields_and_bookkeeping_only() -> None:
    record = {"a": "1", "extra": "dropped", ORIGIN: "x.csv:2", RANK: "r"}
    schema = {"a": INT, "b": TEXT}
    assert conform_record(record, schema) == {"a": 1, "b": None, ORIGIN: "x.csv:2", RANK: "r"}
    # A table's directory serves its image cells here and is not carried further.
    assert conform_record({**record, TABLE_DIR: "/data"}, schema) == conform_record(record, schema)


def test_conform_image_converts_channels_resizes_and_reencodes_png() -> None:
    field = FieldSchema(type="image", height=4, width=6, channels=1)
    converted = conform_value("img", encode(rgb(8, 12), "JPEG"), field)
    assert converted.startswith(b"\x89PNG")
    image = Image.open(io.BytesIO(converted))
    assert (image.mode, image.size) == ("L", (6, 4))
    as_color = FieldSchema(type="image", height=2, width=2, channels=3)
    assert pixels(conform_value("img", encode(gray(2, 2, 9)), as_color)).shape == (2, 2, 3)
    # Same size and mode: the pixels pass through unchanged.
    exact = FieldSchema(type="image", height=3, width=3, channels=1)
    np.testing.assert_array_equal(pixels(conform_value("img", encode(gray(3, 3, 77)), exact)), 77)


def test_conform_scales_16_bit_grayscale_instead_of_clipping() -> None:
    wide = Image.fromarray(np.array([[0, 65535], [32896, 257]], dtype=np.uint16))
    field = FieldSchema(type="image", height=2, width=2, channels=1)
    np.testing.assert_array_equal(
        pixels(conform_value("img", encode(wide), field)), [[0, 255], [128, 1]]
    )


@pytest.mark.parametrize(
    "value",
    [b"", b"garbage", encode(rgb(16, 16))[:60], "path/to/image.png", [1, 2]],
    ids=["empty", "garbage", "truncated", "string", "list"],
)
def test_conform_refuses_corrupt_or_non_image_values(value: Any) -> None:
    field = FieldSchema(type="image", height=4, width=4, channels=3)
    with pytest.raises(ConformError, match=r"^field 'img': expected image \(4x4x3"):
        conform_value("img", value, field)


def test_an_undecodable_image_gets_the_same_reason_in_every_build() -> None:
    """Pillow names its BytesIO (``<_io.BytesIO object at 0x7f…>``): an address per run."""
    field = FieldSchema(type="image", height=4, width=4, channels=3)
    reasons = set()
    for _ in range(3):
        with pytest.raises(ConformError) as raised:
            conform_value("img", b"garbage", field)
        reasons.add(str(raised.value))
    assert reasons == {
        "field 'img': expected image (4x4x3 PNG/JPEG/GIF), got <7 bytes> "
        "(cannot decode image: cannot identify image file)"
    }


def test_conform_refuses_an_image_mode_that_cannot_become_grayscale() -> None:
    lab = encode(Image.new("LAB", (2, 2)), "TIFF")
    field = FieldSchema(type="image", height=2, width=2, channels=1)
    with pytest.raises(ConformError, match="cannot convert image: conversion from LAB"):
        conform_value("img", lab, field)


# --- Beam: read and conform together --------------------------------------------------


def test_read_and_conform_pipeline_with_quarantine(tmp_path: Path) -> None:
    write_images(
        tmp_path,
        {
            "pets/cat/1.png": encode(gray(4, 4, 10)),
            "pets/cat/2.png": encode(rgb(9, 7)),
            "pets/dog/3.jpg": encode(rgb(8, 8, seed=1), "JPEG"),
            "pets/dog/4.jpeg": b"\xff\xd8\xff corrupt jpeg",
        },
    )
    (tmp_path / "extra.jsonl").write_text('{"label": "bird", "weight": 3}\n{broken\n')
    spec = make_spec(
        tmp_path,
        {"type": "image_folder", "path": "pets"},
        {"type": "jsonl", "path": "extra.jsonl"},
        labels=["label"],
    )
    schema = resolve_schema(spec).fields
    assert list(schema) == ["image", "label", "weight"]
    assert (schema["image"].height, schema["image"].width, schema["image"].channels) == (4, 4, 1)

    pipeline = TestPipeline(runner=FN_API_RUNNER)
    read = pipeline | "Read" >> ReadSources(spec)
    conformed = read.records | "Conform" >> ConformToSchema(schema)

    def summary(record: dict[str, Any]) -> tuple[Any, ...]:
        shape = None if record["image"] is None else pixels(record["image"]).shape
        return record[ORIGIN], record["label"], shape, record["weight"]

    assert_that(
        conformed.records | beam.Map(summary),
        equal_to(
            [
                ("pets/cat/1.png", "cat", (4, 4), None),
                ("pets/cat/2.png", "cat", (4, 4), None),
                ("pets/dog/3.jpg", "dog", (4, 4), None),
                ("extra.jsonl:1", "bird", None, 3),
            ]
        ),
        label="conformed",
    )
    quarantine = (
        (read[QUARANTINE_TAG], conformed[QUARANTINE_TAG])
        | beam.Flatten()
        | beam.Map(lambda entry: (entry["origin"], entry["stage"], entry["reason"].split(" (")[0]))
    )
    assert_that(
        quarantine,
        equal_to(
            [
                (
                    "extra.jsonl:2",
                    "read",
                    "invalid JSON: Expecting property name enclosed in double quotes at column 2",
                ),
                ("pets/dog/4.jpeg", "conform", "field 'image': expected image"),
            ]
        ),
        label="quarantine",
    )
    run = pipeline.run()
    run.wait_until_finish()
    counters = {
        c.key.metric.name: c.committed
        for c in run.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]
    }
    assert counters["conform.quarantined.image"] == 1
    assert counters["read.records.image_folder"] == 4
    assert counters["read.quarantined"] == 1
