"""Every name a spec gives a field: checked against the data, then renamed to feature names.

A spec names fields in many places: the schema, labels, cleaning rules, dedup, the
split key, the vocabulary. ``REFERENCES`` lists where, once, so that checking the
names and renaming them (``with_field_names``) can never disagree about it.

The checks run before Beam starts. A name that is not a column of any source, or not
a field, is a ConfigError that names the spec key, the name, the columns each source
has and the closest one ("did you mean 'mean radius'?").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from contracts.yaml_config import ConfigError
from research.data.feature_names import closest_name
from research.data.sources import SourceColumns
from research.data.spec import DatasetSpec, FieldSchema

NAMES_SHOWN = 12  # names listed in a message before "…"


@dataclass(frozen=True)
class Reference:
    """Where a spec names fields: ``key`` (dotted) holds them as ``form``."""

    key: str
    form: Literal["list", "keys", "one"]  # a list (or null), a mapping's keys, one (or null)
    text_only: bool = False  # the fields must be text fields


REFERENCES = (
    Reference("labels", "list"),
    Reference("clean.required", "list"),
    Reference("clean.length", "keys", text_only=True),
    Reference("clean.pii.fields", "list"),
    Reference("dedup.exact.fields", "list"),
    Reference("dedup.near.field", "one", text_only=True),
    Reference("split.key", "one"),
    Reference("vocab.fields", "list", text_only=True),
)
SPLIT_KEY = "split.key"


def _node(data: Mapping[str, Any], key: str) -> Any:
    for part in key.split("."):
        if not isinstance(data, Mapping):
            return None
        data = data.get(part)
    return data


def _referenced_names(data: Mapping[str, Any], reference: Reference) -> list[str]:
    """The field names at ``reference`` in a spec dumped by alias."""
    value = _node(data, reference.key)
    if value is None:
        return []
    return [value] if reference.form == "one" else list(value)


def with_field_names(spec: DatasetSpec, renamed: Mapping[str, str]) -> DatasetSpec:
    """The spec with every field name (schema keys included) replaced per ``renamed``."""
    if not renamed:
        return spec
    data = spec.model_dump(by_alias=True)
    data["schema"] = {renamed.get(name, name): field for name, field in data["schema"].items()}
    for reference in REFERENCES:
        *parents, leaf = reference.key.split(".")
        node = _node(data, ".".join(parents)) if parents else data
        value = node.get(leaf) if isinstance(node, Mapping) else None
        if value is None:
            continue
        if reference.form == "one":
            node[leaf] = renamed.get(value, value)
        elif reference.form == "keys":
            node[leaf] = {renamed.get(name, name): item for name, item in value.items()}
        else:
            node[leaf] = [renamed.get(name, name) for name in value]
    renamed_spec = DatasetSpec.model_validate(data)
    return renamed_spec.model_copy(update={"base_dir": spec.base_dir})


def check_columns(spec: DatasetSpec, found: Sequence[SourceColumns]) -> None:
    """Every declared field and every ``exclude`` entry is a column of some source.

    A source whose columns were only sampled (JSON lines) may hold more; a name is
    refused only when every source's columns are known in full.
    """
    both = [name for name in spec.exclude if name in spec.schema_]
    if both:
        raise ConfigError(f"exclude: {both[0]!r} is also declared under schema; keep one")
    columns = {column for source in found for column in source.columns}
    if not all(source.exhaustive for source in found):
        return
    named = [(f"schema.{name}", name) for name in spec.schema_]
    named += [("exclude", name) for name in spec.exclude]
    for key, name in named:
        if name not in columns:
            raise ConfigError(
                f"{key}: no source has a column {name!r}{_hint(name, columns)}; "
                f"{_describe_columns(found)}"
            )


def check_references(
    spec: DatasetSpec, fields: Mapping[str, FieldSchema], found: Sequence[SourceColumns]
) -> None:
    """Every name the spec refers to is a field (the split key may be any column)."""
    columns = {column for source in found for column in source.columns}
    data = spec.model_dump(by_alias=True)
    for reference in REFERENCES:
        for name in _referenced_names(data, reference):
            if name in fields:
                if reference.text_only and fields[name].type != "text":
                    raise ConfigError(
                        f"{reference.key}: field {name!r} is {fields[name].type}, "
                        "expected a text field"
                    )
                continue
            if name in columns:
                if reference.key == SPLIT_KEY:
                    continue  # a column only the split reads, such as an id
                raise ConfigError(f"{reference.key}: {_not_a_field(spec, name, found)}")
            raise ConfigError(
                f"{reference.key}: unknown field {name!r} (fields: {_listed(fields)})"
                f"{_hint(name, [*fields, *columns])}"
            )


def _not_a_field(spec: DatasetSpec, name: str, found: Sequence[SourceColumns]) -> str:
    where = ", ".join(source.where for source in found if name in source.columns)
    if name in spec.exclude:
        fix = "it is listed under exclude"
    else:
        fix = "declare it under schema (infer_schema is false)"
    return f"{name!r} is a column of {where} but not a field: {fix}"


def _hint(name: str, candidates: Iterable[str]) -> str:
    close = closest_name(name, sorted(candidates))
    return f"; did you mean {close!r}?" if close else ""


def _listed(names: Iterable[str]) -> str:
    names = list(names)
    shown = ", ".join(names[:NAMES_SHOWN])
    return shown + (f", … ({len(names)} in all)" if len(names) > NAMES_SHOWN else "") or "none"


def _describe_columns(found: Sequence[SourceColumns]) -> str:
    return "columns found: " + "; ".join(
        f"{source.where}: {_listed(source.columns)}" for source in found
    )
