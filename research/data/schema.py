"""The dataset schema: inferred from a sample, overridden by the spec, enforced per record.

Inference reads a sample with the very readers the pipeline uses (``sources``), so
what it sees is what the pipeline will get. ``resolve_schema`` merges the declared
fields over the inferred ones and checks that every field the spec names exists.
``ConformToSchema`` then turns each record's loosely typed values (CSV strings, JSON
numbers, raw image files) into the declared types; a value that does not fit sends
its record to quarantine instead of stopping the pipeline.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

import apache_beam as beam
import numpy as np
from PIL import Image, ImageOps

from contracts.yaml_config import ConfigError
from research.data.records import (
    ORIGIN,
    QUARANTINE_TAG,
    Record,
    count,
    public_fields,
    quarantine_entry,
)
from research.data.sources import encode_png, sample_records
from research.data.spec import DatasetSpec, FieldSchema

STAGE = "conform"
SHORT_STRING_CHARS = 20  # mean length above which strings read as text, not categories
DISTINCT_RATIO = 0.9  # share of distinct values above which strings read as text
MIN_VALUES_FOR_DISTINCT = 20  # fewer values than this say nothing about distinctness
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38
GRAY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})

_INT = re.compile(r"[+-]?\d{1,64}")  # longer digit strings are no int64 anyway
_FLOAT = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?|nan|inf|infinity)", re.IGNORECASE)
_LEADING_ZERO = re.compile(r"[+-]?0\d")
_PREVIEW_CHARS = 80


# --- values shared by inference and conformance -------------------------------------


def parse_number(text: str) -> int | float | None:
    """The number a string spells (CSV cells are strings), or None if it spells none."""
    stripped = text.strip()
    if _INT.fullmatch(stripped):
        return int(stripped)
    if _FLOAT.fullmatch(stripped):
        return float(stripped)
    return None


class ImageDecodeError(ValueError):
    """Bytes that Pillow cannot turn into pixels."""


def decode_image(data: bytes) -> Image.Image:
    """Fully decoded pixels, upright as a viewer would show them (EXIF orientation applied)."""
    try:
        with Image.open(io.BytesIO(data)) as opened:
            opened.load()
            return ImageOps.exif_transpose(opened)
    except Exception as exc:
        # Pillow reports corrupt and truncated files through many exception types
        # (OSError, SyntaxError, ValueError, struct.error, DecompressionBombError, ...);
        # any of them means the same thing here: these bytes are not a usable image.
        raise ImageDecodeError(f"cannot decode image: {exc}") from None


def image_channels(image: Image.Image) -> int:
    """1 for grayscale images (including palettes of grays), else 3."""
    if image.mode in GRAY_MODES:
        return 1
    if image.mode in ("P", "PA"):
        palette = image.getpalette() or []
        triples = zip(palette[0::3], palette[1::3], palette[2::3], strict=False)
        if all(red == green == blue for red, green, blue in triples):
            return 1
    return 3


def _to_channels(image: Image.Image, channels: int) -> Image.Image:
    if image.mode.startswith("I;16"):
        # Pillow clips 16-bit values to 8 bits when converting; scale them instead.
        pixels = np.asarray(image, dtype=np.float64)
        image = Image.fromarray(np.round(pixels / 257).clip(0, 255).astype(np.uint8))
    return image.convert("L" if channels == 1 else "RGB")


def _preview(value: Any) -> str:
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    text = repr(value)
    return text if len(text) <= _PREVIEW_CHARS else text[:_PREVIEW_CHARS] + "…"


# --- inference ----------------------------------------------------------------------


def infer_schema(spec: DatasetSpec, sample_size: int = 1000) -> dict[str, FieldSchema]:
    """Infer every field the spec does not declare, from up to ``sample_size`` records.

    Declared fields are skipped so that a field inference cannot handle (always
    missing in the sample, mixed kinds) is fixed by declaring it.
    """
    records = sample_records(spec, sample_size)
    values: dict[str, list[Any]] = {}
    for record in records:
        for name, value in public_fields(record).items():
            present = values.setdefault(name, [])
            if value is not None and value != "":
                present.append(value)
    labels = set(spec.labels)
    return {
        name: _infer_field(name, present, name in labels, len(records))
        for name, present in values.items()
        if name not in spec.schema_
    }


def _infer_field(name: str, values: list[Any], is_label: bool, sampled: int) -> FieldSchema:
    def refuse(problem: str) -> ConfigError:
        return ConfigError(
            f"schema.{name}: cannot infer the field's type: {problem}; declare it under schema"
        )

    if not values:
        raise refuse(f"it has no values in the {sampled} sampled records")
    kinds = {_kind(value) for value in values}
    if len(kinds) > 1 and not kinds <= {"number", "string"}:
        raise refuse(f"its values mix {', '.join(sorted(kinds))}")
    kind = kinds.pop() if len(kinds) == 1 else "string"
    if kind == "object":
        raise refuse("nested objects are not supported")
    if kind == "bytes":
        return _infer_image(values, refuse)
    if kind == "list":
        return _infer_vector(values, refuse)
    numbers = [value if _kind(value) == "number" else _numeric_string(value) for value in values]
    if all(number is not None for number in numbers):
        all_ints = all(isinstance(number, int) for number in numbers)
        if is_label and all_ints:
            return FieldSchema(type="categorical")  # class ids
        return FieldSchema(type="numeric", dtype="int64" if all_ints else "float32")
    return FieldSchema(type=_string_type([str(value) for value in values], is_label))


def _kind(value: Any) -> str:
    if isinstance(value, bytes):
        return "bytes"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, int | float):  # bool included: true/false are 1/0
        return "number"
    if isinstance(value, str):
        return "string"
    return "object"


def _numeric_string(value: str) -> int | float | None:
    """Like ``parse_number``, but '02139' stays a string: leading zeros mark identifiers."""
    if _LEADING_ZERO.match(value.strip()):
        return None
    return parse_number(value)


def _infer_vector(values: list[Any], refuse: Any) -> FieldSchema:
    lengths = sorted({len(value) for value in values})
    if len(lengths) > 1:
        raise refuse(f"its lists have different lengths ({lengths[0]} and {lengths[-1]})")
    items = [item for value in values for item in value]
    if not all(_kind(item) == "number" for item in items):
        raise refuse("its lists hold values that are not numbers")
    dtype = "int64" if all(isinstance(item, int) for item in items) else "float32"
    return FieldSchema(type="numeric", dtype=dtype, shape=[lengths[0]])


def _infer_image(values: list[bytes], refuse: Any) -> FieldSchema:
    for data in values:
        try:
            image = decode_image(data)
        except ImageDecodeError:
            continue
        return FieldSchema(
            type="image",
            height=image.height,
            width=image.width,
            channels=image_channels(image),
        )
    raise refuse(f"none of its {len(values)} sampled images can be decoded")


def _string_type(strings: list[str], is_label: bool) -> str:
    mean_length = sum(len(text) for text in strings) / len(strings)
    if is_label:
        return "categorical" if mean_length <= SHORT_STRING_CHARS else "text"
    # "Mostly" rather than "any": one 'New York' must not turn a city column into text.
    spaced = sum(1 for text in strings if any(char.isspace() for char in text.strip()))
    distinct = len(set(strings)) / len(strings)
    if (
        spaced * 2 > len(strings)
        or mean_length > SHORT_STRING_CHARS
        or (len(strings) >= MIN_VALUES_FOR_DISTINCT and distinct > DISTINCT_RATIO)
    ):
        return "text"
    return "categorical"


# --- resolution ---------------------------------------------------------------------


def resolve_schema(spec: DatasetSpec) -> dict[str, FieldSchema]:
    """Declared fields first (in declaration order), then inferred ones (first seen first)."""
    inferred = infer_schema(spec) if spec.infer_schema else {}
    schema = {**spec.schema_, **inferred}
    if not schema:
        raise ConfigError(
            "schema: no fields: none are declared and the sources gave no readable records"
            if spec.infer_schema
            else "schema: no fields are declared and infer_schema is false"
        )
    _check_references(spec, schema)
    return schema


def _check_references(spec: DatasetSpec, schema: Mapping[str, FieldSchema]) -> None:
    near = [spec.dedup.near.field] if spec.dedup.near else []
    references: list[tuple[str, list[str], bool]] = [  # key, fields, must be text
        ("labels", spec.labels, False),
        ("clean.required", spec.clean.required, False),
        ("clean.length", list(spec.clean.length), True),
        ("clean.pii.fields", spec.clean.pii.fields or [], False),
        ("dedup.exact.fields", spec.dedup.exact.fields or [], False),
        ("dedup.near.field", near, True),
        ("split.key", [spec.split.key] if spec.split.key else [], False),
        ("vocab.fields", spec.vocab.fields or [], True),
    ]
    for key, names, text_only in references:
        for name in names:
            if name not in schema:
                raise ConfigError(f"{key}: unknown field {name!r} (fields: {', '.join(schema)})")
            if text_only and schema[name].type != "text":
                raise ConfigError(
                    f"{key}: field {name!r} is {schema[name].type}, expected a text field"
                )


# --- conformance --------------------------------------------------------------------


class ConformError(ValueError):
    """A value that does not fit its field; the message names field, type and value."""

    def __init__(self, field: str, expected: str, value: Any, detail: str = "") -> None:
        self.field = field
        suffix = f" ({detail})" if detail else ""
        super().__init__(f"field {field!r}: expected {expected}, got {_preview(value)}{suffix}")


def conform_record(record: Record, schema: Mapping[str, FieldSchema]) -> Record:
    """The record with exactly the schema's fields, typed; bookkeeping keys kept."""
    typed = {name: conform_value(name, record.get(name), field) for name, field in schema.items()}
    typed.update((key, value) for key, value in record.items() if key.startswith("_"))
    return typed


def conform_value(name: str, value: Any, field: FieldSchema) -> Any:
    """One value in its field's type, None when missing; ConformError when it does not fit."""
    if value is None or value == "":
        return None
    if field.type == "numeric":
        if field.shape:
            return _vector(name, value, field)
        return _scalar(name, value, field.dtype)
    if field.type == "image":
        return _image(name, value, field)
    return _string(name, value, field.type)


class _Unfit(ValueError):
    """Why one value does not fit a numeric field."""


def _scalar(name: str, value: Any, dtype: str) -> int | float | None:
    try:
        return _number(value, dtype, nan_is_missing=True)
    except _Unfit as exc:
        raise ConformError(name, f"numeric {dtype}", value, str(exc)) from None


def _vector(name: str, value: Any, field: FieldSchema) -> list[int | float | None]:
    (length,) = field.shape
    expected = f"numeric {field.dtype} vector of length {length}"
    if not isinstance(value, list | tuple):
        raise ConformError(name, expected, value)
    if len(value) != length:
        raise ConformError(name, expected, value, f"length {len(value)}")
    typed = []
    for position, item in enumerate(value):
        try:
            typed.append(_number(item, field.dtype, nan_is_missing=False))
        except _Unfit as exc:
            detail = f"item {position}: {exc}"
            raise ConformError(name, expected, value, detail) from None
    return typed


def _number(value: Any, dtype: str, *, nan_is_missing: bool) -> int | float | None:
    if isinstance(value, str):
        number = parse_number(value)
    elif isinstance(value, int | float):
        number = value
    else:
        number = None
    if number is None:
        raise _Unfit("not a number")
    if isinstance(number, float) and math.isnan(number):
        if nan_is_missing:
            return None  # NaN is how numpy and pandas write "missing"
        raise _Unfit("NaN")
    if dtype == "int64":
        if isinstance(number, float) and not number.is_integer():
            raise _Unfit("not a whole number")
        if not INT64_MIN <= int(number) <= INT64_MAX:
            raise _Unfit("out of int64 range")
        return int(number)
    if not abs(float(number)) <= FLOAT32_MAX:
        raise _Unfit("out of float32 range")
    return float(number)


def _string(name: str, value: Any, kind: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int):  # bool included, as 1/0 like everywhere else
        return str(int(value))
    if kind == "categorical" and isinstance(value, float) and value.is_integer():
        return str(int(value))  # class ids stored as floats (1.0) are still class 1
    raise ConformError(name, f"{kind} (string)", value)


def _image(name: str, value: Any, field: FieldSchema) -> bytes:
    expected = f"image ({field.height}x{field.width}x{field.channels} PNG/JPEG bytes)"
    if not isinstance(value, bytes):
        raise ConformError(name, expected, value)
    try:
        image = _to_channels(decode_image(value), field.channels)
    except ImageDecodeError as exc:
        raise ConformError(name, expected, value, str(exc)) from None
    except ValueError as exc:  # a mode Pillow cannot convert (LAB to L, La, ...)
        raise ConformError(name, expected, value, f"cannot convert image: {exc}") from None
    if image.size != (field.width, field.height):
        image = image.resize((field.width, field.height), Image.Resampling.BILINEAR)
    return encode_png(image)


class _ConformFn(beam.DoFn):
    def __init__(self, schema: Mapping[str, FieldSchema]) -> None:
        self._schema = dict(schema)

    def process(self, record: Record) -> Iterator[Any]:
        try:
            yield conform_record(record, self._schema)
        except ConformError as exc:
            count(f"conform.quarantined.{exc.field}")
            raw = {
                key: _preview(value) if isinstance(value, bytes) else value
                for key, value in public_fields(record).items()
            }
            origin = str(record.get(ORIGIN, ""))
            yield beam.pvalue.TaggedOutput(
                QUARANTINE_TAG, quarantine_entry(origin, STAGE, str(exc), raw)
            )


class ConformToSchema(beam.PTransform):
    """Records -> typed records (main output ``records``) and ``quarantine``."""

    def __init__(self, schema: Mapping[str, FieldSchema]) -> None:
        super().__init__()
        self._schema = dict(schema)

    def expand(self, records: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        return records | "Conform" >> beam.ParDo(_ConformFn(self._schema)).with_outputs(
            QUARANTINE_TAG, main="records"
        )
