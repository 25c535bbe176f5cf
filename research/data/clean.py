"""Cleaning: normalise text, drop records that break the spec's rules, mask personal data.

Per record, in this order, so each rule sees what the next stage will see:

1. text and categorical values are Unicode-normalised (NFKC by default, which also
   folds full-width digits and ligatures) and their whitespace collapsed to single
   spaces and stripped, when ``collapse_whitespace`` is on;
2. a record missing a required field (None, or an empty string or bytes after step 1)
   is dropped;
3. a string field shorter or longer than its length bounds (in characters, after
   step 1) is dropped; a missing optional value is not measured;
4. personal data is masked in the PII fields (every text field by default).

Every drop and every masked item is counted (``clean.dropped.<rule>.<field>``,
``clean.masked.<kind>``, ``clean.records_masked``) for the data report, and every
dropped record goes to the ``dropped`` output with its rule and reason, for
``dropped.jsonl``. The rules are a pure function (``clean_record``) so they can be
tested without a pipeline.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam

from contracts.yaml_config import ConfigError
from research.data import records
from research.data.pii import mask_pii
from research.data.records import DROPPED_TAG, Record, dropped_entry
from research.data.spec import CleanSpec, FieldSchema

STRING_TYPES = ("text", "categorical")


@dataclass(frozen=True)
class CleanRules:
    """A ``CleanSpec`` resolved against the schema, checked once before the pipeline runs."""

    normalization: str | None
    collapse_whitespace: bool
    string_fields: tuple[str, ...]
    required: tuple[str, ...]
    bounds: tuple[tuple[str, int, int | None], ...]
    pii_fields: tuple[str, ...]
    pii_kinds: tuple[str, ...]
    phone_regions: tuple[str, ...]


@dataclass(frozen=True)
class Cleaned:
    """What cleaning did to one record: the record to keep, or the rule that dropped it."""

    record: Record | None
    dropped_by: str | None = None  # counter name, e.g. "clean.dropped.required.text"
    reason: str = ""  # why, for people: the field, its value and the bound it broke
    masked: Mapping[str, int] = field(default_factory=dict)


def compile_rules(
    clean: CleanSpec, schema: Mapping[str, FieldSchema], required: list[str]
) -> CleanRules:
    """Resolve the spec against the schema; ConfigError names a field the rules cannot use."""
    strings = tuple(name for name, spec in schema.items() if spec.type in STRING_TYPES)
    required = list(dict.fromkeys([*clean.required, *required]))
    _check_known("required", required, schema)
    _check_strings("clean.length", list(clean.length), schema)
    for name, bounds in clean.length.items():
        if bounds.max is not None and bounds.max < bounds.min:
            raise ConfigError(f"clean.length.{name}: max {bounds.max} is below min {bounds.min}")
    pii_fields: tuple[str, ...] = ()
    if clean.pii.enabled:
        if clean.pii.fields is None:
            pii_fields = tuple(name for name, spec in schema.items() if spec.type == "text")
        else:
            _check_strings("clean.pii.fields", clean.pii.fields, schema)
            pii_fields = tuple(clean.pii.fields)
    form = clean.unicode_normalization
    return CleanRules(
        normalization=None if form == "none" else form,
        collapse_whitespace=clean.collapse_whitespace,
        string_fields=strings,
        required=tuple(required),
        bounds=tuple((name, b.min, b.max) for name, b in clean.length.items()),
        pii_fields=pii_fields if clean.pii.kinds else (),
        pii_kinds=tuple(clean.pii.kinds),
        phone_regions=tuple(clean.pii.phone_regions),
    )


def _check_known(where: str, names: list[str], schema: Mapping[str, FieldSchema]) -> None:
    unknown = [name for name in names if name not in schema]
    if unknown:
        raise ConfigError(
            f"{where}: no field named {', '.join(map(repr, unknown))} in the schema "
            f"(fields: {', '.join(schema) or 'none'})"
        )


def _check_strings(where: str, names: list[str], schema: Mapping[str, FieldSchema]) -> None:
    _check_known(where, names, schema)
    wrong = [name for name in names if schema[name].type not in STRING_TYPES]
    if wrong:
        raise ConfigError(
            f"{where}: {', '.join(map(repr, wrong))} must be text or categorical fields, not "
            + ", ".join(schema[name].type for name in wrong)
        )


def normalize_text(value: str, form: str | None, collapse_whitespace: bool) -> str:
    """One string value as every later stage will see it."""
    if form is not None:
        value = unicodedata.normalize(form, value)
    if collapse_whitespace:
        value = " ".join(value.split())
    return value


def _is_missing(value: object) -> bool:
    return value is None or value == "" or value == b""


def clean_record(record: Record, rules: CleanRules) -> Cleaned:
    """Apply the rules to one record (the input is not modified)."""
    cleaned = dict(record)
    for name in rules.string_fields:
        value = cleaned.get(name)
        if isinstance(value, str):
            cleaned[name] = normalize_text(value, rules.normalization, rules.collapse_whitespace)
    for name in rules.required:
        if _is_missing(cleaned.get(name)):
            return Cleaned(
                None, f"clean.dropped.required.{name}", f"required field {name!r} has no value"
            )
    for name, shortest, longest in rules.bounds:
        value = cleaned.get(name)
        if not isinstance(value, str):
            continue
        if len(value) < shortest:
            return _length_drop(name, len(value), "min", shortest)
        if longest is not None and len(value) > longest:
            return _length_drop(name, len(value), "max", longest)
    cleaned, masked = mask_fields(cleaned, rules)
    return Cleaned(cleaned, masked=masked)


def _length_drop(name: str, length: int, bound: str, limit: int) -> Cleaned:
    rule = "too_short" if bound == "min" else "too_long"
    reason = f"field {name!r} has {length} characters, clean.length.{name}.{bound} is {limit}"
    return Cleaned(None, f"clean.dropped.{rule}.{name}", reason)


def mask_fields(record: Record, rules: CleanRules) -> tuple[Record, dict[str, int]]:
    """The record with personal data masked in its PII fields, and what was masked."""
    masked_record = dict(record)
    masked: dict[str, int] = {}
    for name in rules.pii_fields:
        value = masked_record.get(name)
        if not isinstance(value, str):
            continue
        masked_record[name], counts = mask_pii(value, rules.pii_kinds, rules.phone_regions)
        for kind, found in counts.items():
            if found:
                masked[kind] = masked.get(kind, 0) + found
    return masked_record, masked


class CleanRecords(beam.PTransform):
    """Normalise, filter and mask records per the spec's ``clean`` section.

    Outputs ``records`` (the main output) and ``dropped`` (dropped.jsonl entries).
    ``required`` adds to the spec's ``clean.required`` the fields without which a record
    is useless to the caller (labels, say). Misconfigured rules raise ConfigError when
    the transform is built, before any data is read.
    """

    def __init__(
        self, clean: CleanSpec, schema: Mapping[str, FieldSchema], required: list[str]
    ) -> None:
        super().__init__()
        self._rules = compile_rules(clean, schema, required)

    def expand(self, pcoll: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        return pcoll | "Clean" >> beam.FlatMap(_clean_and_count, self._rules).with_outputs(
            DROPPED_TAG, main="records"
        )


def _clean_and_count(record: Record, rules: CleanRules) -> Iterator[Any]:
    outcome = clean_record(record, rules)
    if outcome.dropped_by is not None:
        records.count(outcome.dropped_by)
        # dropped.jsonl sits beside the dataset: it must not carry what the dataset masks.
        preview, _ = mask_fields(record, rules)
        entry = dropped_entry(preview, "clean", outcome.dropped_by, outcome.reason)
        yield beam.pvalue.TaggedOutput(DROPPED_TAG, entry)
        return
    if outcome.masked:
        records.count("clean.records_masked")
        for kind, found in outcome.masked.items():
            records.count(f"clean.masked.{kind}", found)
    yield outcome.record
