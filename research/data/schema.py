"""The dataset schema: declared, inferred, checked against the data, enforced per record.

``resolve_schema`` runs before the pipeline: it lists the columns every source has,
checks every field name the spec uses against them (``references``), infers the
fields the spec does not declare (``inference``) and names each field so that a model
input and a serving signature can carry it (``feature_names``). ``ConformToSchema``
then turns each record's loosely typed values (CSV strings, JSON numbers, raw image
files) into the declared types under those names; a value that does not fit sends
its record to quarantine instead of stopping the pipeline.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from PIL import Image

from contracts.features import plain_numbers
from contracts.yaml_config import ConfigError
from research.data.feature_names import feature_names
from research.data.image_cells import ImageCellError, image_cell_bytes
from research.data.inference import infer_schema
from research.data.reading import encode_png
from research.data.records import (
    ORIGIN,
    QUARANTINE_TAG,
    TABLE_DIR,
    Record,
    count,
    is_bookkeeping,
    public_fields,
    quarantine_entry,
)
from research.data.references import check_columns, check_references, with_field_names
from research.data.sources import source_columns
from research.data.spec import DatasetSpec, FieldSchema
from research.data.values import (
    ImageDecodeError,
    decode_image,
    parse_number,
    preview,
    to_channels,
)

STAGE = "conform"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38
# Where a split key that is not a field travels: a bookkeeping key, read by the split
# and by nothing else (not dedup, not the shards).
SPLIT_KEY = "_split_key"
DECLARED = "declared in the spec"


# --- resolution ---------------------------------------------------------------------


@dataclass(frozen=True)
class ResolvedSchema:
    """The fields a build writes, under their feature names, and why each has its type.

    ``spec`` is the spec with every field name replaced by its feature name: the one the
    stages after conformance read. ``columns`` maps each key of a conformed record that
    is not named like its source column to that column: features renamed, and
    ``SPLIT_KEY`` when the split key is a column but not a field.
    """

    spec: DatasetSpec
    fields: dict[str, FieldSchema]
    columns: dict[str, str]
    reasons: dict[str, str]

    def report(self) -> dict[str, dict[str, Any]]:
        """``report.json``'s ``schema`` section: each feature's type, column and reason."""
        described = {}
        for name, field in self.fields.items():
            entry = field.model_dump(exclude_defaults=True)
            if field.type == "numeric":
                entry["dtype"] = field.dtype
            if name in self.columns:
                entry["column"] = self.columns[name]
            entry["why"] = self.reasons[name]
            described[name] = entry
        return described


def resolve_schema(spec: DatasetSpec) -> ResolvedSchema:
    """Declared fields first (in declaration order), then inferred ones (first seen first).

    Everything here happens before the pipeline runs, so a misnamed field or a misread
    file is a ConfigError, not a build that quietly writes the wrong dataset.
    """
    found = source_columns(spec)
    check_columns(spec, found)
    inferred = infer_schema(spec) if spec.infer_schema else {}
    fields = {**spec.schema_, **{name: guess.field for name, guess in inferred.items()}}
    if not fields:
        sources = ", ".join(source.where for source in found)
        raise ConfigError(
            f"schema: no fields: none are declared, and the sources ({sources}) gave no "
            "readable record to infer them from: they hold no data rows, or none can be read"
            if spec.infer_schema
            else "schema: no fields are declared and infer_schema is false"
        )
    check_references(spec, fields, found)
    renamed = feature_names(fields)
    key = spec.split.key
    if key is not None and key not in fields:
        renamed[key] = SPLIT_KEY
    return ResolvedSchema(
        spec=with_field_names(spec, {old: new for old, new in renamed.items() if old != new}),
        fields={renamed[name]: field for name, field in fields.items()},
        columns={new: old for old, new in renamed.items() if old != new},
        reasons={
            renamed[name]: inferred[name].why if name in inferred else DECLARED for name in fields
        },
    )


# --- conformance --------------------------------------------------------------------


class ConformError(ValueError):
    """A value that does not fit its field; the message names field, type and value."""

    def __init__(self, field: str, expected: str, value: Any, detail: str = "") -> None:
        self.field = field
        suffix = f" ({detail})" if detail else ""
        super().__init__(f"field {field!r}: expected {expected}, got {preview(value)}{suffix}")


def conform_record(
    record: Record, schema: Mapping[str, FieldSchema], columns: Mapping[str, str] | None = None
) -> Record:
    """The record with exactly the schema's fields, typed; bookkeeping keys kept.

    ``columns`` (``ResolvedSchema.columns``) names the source column of each key that
    is named differently; a key there that is not a field is carried as it was read.
    """
    columns = columns or {}
    table_dir = record.get(TABLE_DIR)
    typed = {
        name: conform_value(
            columns.get(name, name), record.get(columns.get(name, name)), field, table_dir
        )
        for name, field in schema.items()
    }
    typed.update(
        (key, value)
        for key, value in record.items()
        if is_bookkeeping(key) and key != TABLE_DIR  # used here only: not carried further
    )
    typed.update((key, record.get(column)) for key, column in columns.items() if key not in schema)
    return typed


def conform_value(name: str, value: Any, field: FieldSchema, table_dir: str | None = None) -> Any:
    """One value in its field's type, None when missing; ConformError when it does not fit.

    ``table_dir``: where image paths in a table's cells are taken from."""
    if value is None or value == "":
        return None
    if field.type == "numeric":
        if field.shape:
            return _vector(name, value, field)
        return _scalar(name, value, field)
    if field.type == "image":
        return _image(name, value, field, table_dir)
    return _string(name, value, field.type)


_KEEP_HINT = "; the field's non_finite: keep would keep it"


class _Unfit(ValueError):
    """Why one value does not fit a numeric field."""


def _scalar(name: str, value: Any, field: FieldSchema) -> int | float | None:
    try:
        return _number(value, field, nan_is_missing=True)
    except _Unfit as exc:
        raise ConformError(name, f"numeric {field.dtype}", value, str(exc)) from None


def _vector(name: str, value: Any, field: FieldSchema) -> list[int | float | None]:
    (length,) = field.shape
    expected = f"numeric {field.dtype} vector of length {length}"
    if not isinstance(value, list | tuple):
        raise ConformError(name, expected, value)
    if len(value) != length:
        raise ConformError(name, expected, value, f"length {len(value)}")
    fast = _plain_vector(value, field.dtype)
    if fast is not None:
        return fast
    typed = []
    for position, item in enumerate(value):
        try:
            typed.append(_number(item, field, nan_is_missing=False))
        except _Unfit as exc:
            detail = f"item {position}: {exc}"
            raise ConformError(name, expected, value, detail) from None
    return typed


def _plain_vector(value: list[Any] | tuple[Any, ...], dtype: str) -> list[int | float] | None:
    """What ``_number`` makes of every item when all are in-range Python numbers, read at
    C speed; None when any item needs ``_number``'s checks (and perhaps its error)."""
    if not plain_numbers(value):
        return None
    if dtype == "int64":
        if set(map(type, value)) == {int} and min(value) >= INT64_MIN and max(value) <= INT64_MAX:
            return list(value)
        return None
    # The range check comes first: it short-circuits before isfinite meets a huge int.
    if max(map(abs, value)) <= FLOAT32_MAX and all(map(math.isfinite, value)):
        return list(map(float, value))
    return None


def _number(value: Any, field: FieldSchema, *, nan_is_missing: bool) -> int | float | None:
    dtype, keep = field.dtype, field.non_finite == "keep"
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
        if keep:
            return number
        raise _Unfit(f"NaN{_KEEP_HINT}")
    if isinstance(number, float) and math.isinf(number):
        if keep:
            return number
        # Nothing a model can learn from or scale by, unless the spec says it knows.
        raise _Unfit(f"not finite ({number}){'' if dtype == 'int64' else _KEEP_HINT}")
    if dtype == "int64":
        if isinstance(number, float) and not number.is_integer():
            raise _Unfit("not a whole number")
        if not INT64_MIN <= int(number) <= INT64_MAX:
            raise _Unfit("out of int64 range")
        return int(number)
    if not abs(number) <= FLOAT32_MAX:  # exact for an int too big for any float
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


def _image(name: str, value: Any, field: FieldSchema, table_dir: str | None) -> bytes:
    expected = f"image ({field.height}x{field.width}x{field.channels} PNG/JPEG/GIF)"
    if isinstance(value, str | dict):  # a table's cell: a file path or base64 text
        try:
            value = image_cell_bytes(value, table_dir)
        except ImageCellError as exc:
            raise ConformError(name, expected, value, str(exc)) from None
    if not isinstance(value, bytes):
        raise ConformError(name, expected, value)
    try:
        image = to_channels(decode_image(value), field.channels)
    except ImageDecodeError as exc:
        raise ConformError(name, expected, value, _without_addresses(str(exc))) from None
    except ValueError as exc:  # a mode Pillow cannot convert (LAB to L, La, ...)
        detail = _without_addresses(f"cannot convert image: {exc}")
        raise ConformError(name, expected, value, detail) from None
    if image.size != (field.width, field.height):
        image = image.resize((field.width, field.height), Image.Resampling.BILINEAR)
    return encode_png(image)


# An object's repr in a library's message, e.g. Pillow's "<_io.BytesIO object at 0x7f98…>".
_OBJECT_REPR = re.compile(r"\s*<[^<>]*\bat 0x[0-9A-Fa-f]+>")


def _without_addresses(message: str) -> str:
    """The message without object reprs: their memory addresses differ on every run, and
    a quarantine reason must be the same in every build."""
    return _OBJECT_REPR.sub("", message)


class _ConformFn(beam.DoFn):
    def __init__(self, schema: Mapping[str, FieldSchema], columns: Mapping[str, str]) -> None:
        self._schema = dict(schema)
        self._columns = dict(columns)

    def process(self, record: Record) -> Iterator[Any]:
        try:
            yield conform_record(record, self._schema, self._columns)
        except ConformError as exc:
            count(f"conform.quarantined.{exc.field}")
            raw = {
                key: preview(value) if isinstance(value, bytes) else value
                for key, value in public_fields(record).items()
            }
            origin = str(record.get(ORIGIN, ""))
            yield beam.pvalue.TaggedOutput(
                QUARANTINE_TAG, quarantine_entry(origin, STAGE, str(exc), raw)
            )


class ConformToSchema(beam.PTransform):
    """Records -> typed records (main output ``records``) and ``quarantine``."""

    def __init__(
        self, schema: Mapping[str, FieldSchema], columns: Mapping[str, str] | None = None
    ) -> None:
        super().__init__()
        self._schema = dict(schema)
        self._columns = dict(columns or {})

    def expand(self, records: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        conform = _ConformFn(self._schema, self._columns)
        return records | "Conform" >> beam.ParDo(conform).with_outputs(
            QUARANTINE_TAG, main="records"
        )
