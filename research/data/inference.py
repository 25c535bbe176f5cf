"""Schema inference: each undeclared field's type from a sample, and the reason for it.

Inference reads a sample with the very readers the pipeline uses (``sources``), so
what it sees is what the pipeline will get. Missing values (``None``, which CSV
``na_values`` such as ``n/a`` and ``?`` become) are not evidence of any type.

A column of numbers with a few cells that spell no number (at most
``MAX_UNPARSEABLE_SHARE`` of its sampled values) stays numeric: one ``abc`` in 569
measurements is a bad cell, not a categorical column of 569 values. Conformance then
quarantines the records with such cells, each with its reason. Every inferred field
carries the reason for its type, in numbers a person can check, for ``report.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contracts.yaml_config import ConfigError
from research.data.records import ORIGIN, is_bookkeeping
from research.data.sources import sample_records
from research.data.spec import DatasetSpec, FieldSchema
from research.data.values import (
    ImageDecodeError,
    decode_image,
    has_leading_zero,
    image_channels,
    parse_number,
    preview,
)

SAMPLE_SIZE = 1000  # records read for inference
MAX_UNPARSEABLE_SHARE = 0.02  # of a numeric column's values that may fail to parse
SHORT_STRING_CHARS = 20  # mean length above which strings read as text, not categories
DISTINCT_RATIO = 0.9  # share of distinct values above which strings read as text
MIN_VALUES_FOR_DISTINCT = 20  # fewer values than this say nothing about distinctness
BAD_CELLS_SHOWN = 3  # unparseable cells quoted in a reason

Observed = list[tuple[Any, str]]  # (value, origin) of every non-missing sampled value


@dataclass(frozen=True)
class InferredField:
    """A field as inferred, and why, e.g. 'numeric float32: 568 of 569 sampled values ...'."""

    field: FieldSchema
    why: str


def infer_schema(spec: DatasetSpec, sample_size: int = SAMPLE_SIZE) -> dict[str, InferredField]:
    """Infer every column the spec neither declares nor excludes, from a sample.

    Declared fields are skipped so that a field inference cannot handle (always
    missing in the sample, mixed kinds) is fixed by declaring it.
    """
    records = sample_records(spec, sample_size)
    observed: dict[str, Observed] = {}
    for record in records:
        for name, value in record.items():
            if is_bookkeeping(name):
                continue
            values = observed.setdefault(name, [])
            if value is not None and value != "":
                values.append((value, str(record[ORIGIN])))
    skipped = {*spec.schema_, *spec.exclude}
    labels = set(spec.labels)
    return {
        name: _infer_field(name, values, name in labels, len(records))
        for name, values in observed.items()
        if name not in skipped
    }


def _infer_field(name: str, observed: Observed, is_label: bool, sampled: int) -> InferredField:
    def refuse(problem: str) -> ConfigError:
        return ConfigError(
            f"schema.{name}: cannot infer the field's type: {problem}; declare it under schema"
        )

    if not observed:
        raise refuse(f"it has no values in the {sampled} sampled records")
    values = [value for value, _ in observed]
    kinds = {_kind(value) for value in values}
    if len(kinds) > 1 and not kinds <= {"number", "string"}:
        raise refuse(f"its values mix {', '.join(sorted(kinds))}")
    kind = kinds.pop() if len(kinds) == 1 else "string"
    if kind == "object":
        raise refuse("nested objects are not supported")
    if kind == "bytes":
        inferred = _infer_image(values, refuse)
    elif kind == "list":
        inferred = _infer_vector(values, refuse)
    else:
        inferred = _infer_scalar(observed, is_label)
    missing = sampled - len(observed)
    if missing:
        inferred = InferredField(
            inferred.field, f"{inferred.why}; {missing} of {sampled} sampled records lack it"
        )
    return inferred


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


def _infer_scalar(observed: Observed, is_label: bool) -> InferredField:
    """Numbers (tolerating a few bad cells), class ids, categories or text."""
    total = len(observed)
    numbers = [value for value, _ in observed if not isinstance(value, str)]
    strings = [(value, origin) for value, origin in observed if isinstance(value, str)]
    spelled = [parse_number(value) for value, _ in strings]
    coded = [
        v
        for (v, _), n in zip(strings, spelled, strict=True)
        if n is not None and has_leading_zero(v)
    ]
    numbers += [number for number in spelled if number is not None]
    bad = [(v, o) for (v, o), n in zip(strings, spelled, strict=True) if n is None]
    if coded:
        return _infer_strings(
            observed,
            is_label,
            f"{len(coded)} of {total} sampled values have leading zeros (identifiers, "
            f"e.g. {preview(coded[0])})",
        )
    if len(bad) > MAX_UNPARSEABLE_SHARE * total:
        share = f"{MAX_UNPARSEABLE_SHARE:.0%}"
        evidence = (
            f"{len(bad)} of {total} sampled values are not numbers (more than {share}), "
            f"e.g. {preview(bad[0][0])}"
        )
        return _infer_strings(observed, is_label, evidence if numbers else "")
    all_ints = all(isinstance(number, int) for number in numbers)
    if is_label and all_ints:
        others = (
            f"; {len(bad)} other values (e.g. {preview(bad[0][0])}) are classes too" if bad else ""
        )
        return InferredField(
            FieldSchema(type="categorical"),
            f"categorical: a label whose {len(numbers)} numeric sampled values are all whole "
            f"numbers (class ids){others}",
        )
    dtype = "int64" if all_ints else "float32"
    what = "whole numbers" if all_ints else "numbers"
    if not bad:
        why = f"numeric {dtype}: all {total} sampled values are {what}"
    else:
        shown = ", ".join(f"{preview(v)} at {o}" for v, o in bad[:BAD_CELLS_SHOWN])
        more = ", …" if len(bad) > BAD_CELLS_SHOWN else ""
        cells = "cell" if len(bad) == 1 else "cells"
        records = "its record" if len(bad) == 1 else "their records"
        why = (
            f"numeric {dtype}: {total - len(bad)} of {total} sampled values are {what}; "
            f"{len(bad)} unparseable {cells} ({shown}{more}) quarantined with {records}"
        )
    return InferredField(FieldSchema(type="numeric", dtype=dtype), why)


def _infer_strings(observed: Observed, is_label: bool, not_numeric: str) -> InferredField:
    """Categorical or text, by length, spaces and distinctness of the values."""
    strings = [str(value) for value, _ in observed]
    field_type, evidence = _string_type(strings, is_label)
    why = f"{field_type}: {evidence}" + (f"; {not_numeric}" if not_numeric else "")
    return InferredField(FieldSchema(type=field_type), why)


def _string_type(strings: list[str], is_label: bool) -> tuple[str, str]:
    total = len(strings)
    mean_length = sum(len(text) for text in strings) / total
    length = f"mean length {mean_length:.1f} characters"
    if is_label:
        if mean_length <= SHORT_STRING_CHARS:
            return "categorical", f"a label of short strings ({length})"
        return "text", f"a label of long strings ({length} > {SHORT_STRING_CHARS})"
    # "Mostly" rather than "any": one 'New York' must not turn a city column into text.
    spaced = sum(1 for text in strings if any(char.isspace() for char in text.strip()))
    distinct = len(set(strings))
    if spaced * 2 > total:
        return "text", f"{spaced} of {total} sampled values contain spaces"
    if mean_length > SHORT_STRING_CHARS:
        return "text", f"{length} > {SHORT_STRING_CHARS}"
    if total >= MIN_VALUES_FOR_DISTINCT and distinct / total > DISTINCT_RATIO:
        return "text", f"{distinct} of {total} sampled values are distinct"
    return "categorical", f"{distinct} distinct values in {total} sampled ({length})"


def _infer_vector(values: list[Any], refuse: Callable[[str], ConfigError]) -> InferredField:
    lengths = sorted({len(value) for value in values})
    if len(lengths) > 1:
        raise refuse(f"its lists have different lengths ({lengths[0]} and {lengths[-1]})")
    items = [item for value in values for item in value]
    if not all(_kind(item) == "number" for item in items):
        raise refuse("its lists hold values that are not numbers")
    dtype = "int64" if all(isinstance(item, int) for item in items) else "float32"
    return InferredField(
        FieldSchema(type="numeric", dtype=dtype, shape=[lengths[0]]),
        f"numeric {dtype} vector: all {len(values)} sampled values are lists of "
        f"{lengths[0]} numbers",
    )


def _infer_image(values: list[bytes], refuse: Callable[[str], ConfigError]) -> InferredField:
    for tried, data in enumerate(values, start=1):
        try:
            image = decode_image(data)
        except ImageDecodeError:
            continue
        field = FieldSchema(
            type="image",
            height=image.height,
            width=image.width,
            channels=image_channels(image),
        )
        skipped = f" ({tried - 1} undecodable before it)" if tried > 1 else ""
        return InferredField(
            field,
            f"image {image.height}x{image.width}x{field.channels}: the first decodable "
            f"sampled image{skipped}",
        )
    raise refuse(f"none of its {len(values)} sampled images can be decoded")
