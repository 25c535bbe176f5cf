"""The dataset spec reference (``docs/reference/data-spec.md``), generated from the spec's model.

Every key of ``research.data.spec.DatasetSpec`` with its type, constraints, default,
description and an example, so the reference cannot drift from what ``load_spec``
accepts: ``tests/research/test_spec_reference.py`` fails when the committed file and
this output differ. Regenerate it with::

    python -m research.data.spec_reference > docs/reference/data-spec.md

An example is the value a shipped spec in ``examples/data/`` gives the key, when one
does (real and known to build); otherwise it comes from ``EXAMPLES`` below.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from research.data.spec import DatasetSpec

EXAMPLE_SPECS = Path(__file__).resolve().parents[2] / "examples" / "data"
EXAMPLE_CHARS = 80  # a longer example is cut: the spec it comes from has the rest
ANY_NAME = "<field>"  # a key the spec author chooses: a field name in ``schema``

# Examples for the keys no shipped spec sets, by key path (see ``Key.path``).
EXAMPLES: dict[str, Any] = {
    "exclude": ["row_id"],
    "sources[csv].delimiter": ";",
    "sources[csv].comment": "#",
    "sources[csv].encoding": "latin-1",
    "sources[csv].na_values": ["", "NA", "missing"],
    "sources[csv].rename": {"Mean Radius": "mean_radius"},
    "sources[jsonl].rename": {"body": "text"},
    "sources[text].path": "reviews/*.txt",
    "sources[text].mode": "file",
    "sources[text].field": "review",
    "sources[text].encoding": "latin-1",
    "sources[text].label": "positive",
    "sources[text].label_field": "sentiment",
    "sources[image_folder].image_field": "photo",
    "sources[image_folder].label_field": "species",
    "sources[hdf5].path": "scans.h5",
    "sources[hdf5].fields": {"image": "/scans", "label": "/labels"},
    "sources[hdf5].images": ["image"],
    "schema.<field>.shape": [3],
    "schema.<field>.clip": [0, 1000000],
    "schema.<field>.transform": "log",
    "schema.<field>.words.max_terms": 50000,
    "clean.unicode_normalization": "NFC",
    "clean.collapse_whitespace": False,
    "clean.pii.enabled": False,
    "clean.pii.kinds": ["email", "phone"],
    "clean.pii.phone_regions": ["US", "CA", "GB", "IN"],
    "dedup.near.num_perm": 256,
    "split.key": "user_id",
    "vocab.character_coverage": 1.0,
    "vocab.input_sentence_size": 200_000,
    "vocab.input_characters": 50_000_000,
}


@dataclass(frozen=True)
class Key:
    """One key of the spec, as a row of the reference."""

    path: str  # "clean.pii.kinds"; "sources[csv].path" for a key of one source type
    section: str  # the heading it is listed under
    type: str
    default: str
    description: str
    field: FieldInfo


def spec_keys() -> list[Key]:
    """Every key of the spec, in the order the model declares them."""
    return list(_model_keys(DatasetSpec, "", "Top level"))


def _model_keys(model: type[BaseModel], prefix: str, section: str) -> Iterator[Key]:
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        path = prefix + (field.alias or name)
        yield Key(path, section, _type(field), _default(field), field.description or "", field)
        yield from _nested_keys(field.annotation, path)


def _nested_keys(annotation: Any, path: str) -> Iterator[Key]:
    """The keys below ``path``: a section's own keys, a source type's, a field's."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield from _model_keys(annotation, f"{path}.", path)
    elif origin in (typing.Union, types.UnionType):
        for arg in args:
            if arg is not type(None):
                yield from _nested_keys(arg, path)
    elif origin is dict and _is_model(args[1]):
        yield from _model_keys(args[1], f"{path}.{ANY_NAME}.", path)
    elif origin is list and typing.get_origin(args[0]) is typing.Annotated:
        for source in typing.get_args(typing.get_args(args[0])[0]):  # a discriminated union
            kind = typing.get_args(source.model_fields["type"].annotation)[0]
            keys = _model_keys(source, f"{path}[{kind}].", f"{path}: type {kind}")
            yield from (key for key in keys if not key.path.endswith("].type"))


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


# ------------------------------------------------------------------------------ rendering


def _type(field: FieldInfo) -> str:
    described = _type_name(field.annotation)
    limits = [_constraint(item) for item in field.metadata]
    return ", ".join([described, *(limit for limit in limits if limit)])


def _type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return "one of " + ", ".join(f"`{_yaml(arg)}`" for arg in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in args)
    if origin is typing.Annotated:
        return "source (see below)"
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"mapping of {_type_name(args[0])} to {_type_name(args[1])}"
    if _is_model(annotation):
        return "mapping (see below)"
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _constraint(item: Any) -> str | None:
    bounds = (
        (annotated_types.Gt, "gt", ">"),
        (annotated_types.Ge, "ge", "≥"),
        (annotated_types.Lt, "lt", "<"),
        (annotated_types.Le, "le", "≤"),
    )
    for kind, attribute, sign in bounds:
        if isinstance(item, kind):
            return f"{sign} {getattr(item, attribute)}"
    if isinstance(item, annotated_types.MinLen):
        return f"at least {item.min_length} long"
    pattern = getattr(item, "pattern", None)
    return f"matching `{pattern}`" if pattern else None


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(the defaults below)"
    return f"`{_yaml(value)}`"


def _yaml(value: Any) -> str:
    """A value as it is written in a spec, on one line."""
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000)
    return text.strip().removesuffix("...").strip().replace("|", "\\|")


# ------------------------------------------------------------------------------- examples


def shipped_examples() -> dict[str, tuple[Any, str]]:
    """Key path -> (value, spec file name) for every key a spec in examples/data sets."""
    found: dict[str, tuple[Any, str]] = {}
    for path in sorted(EXAMPLE_SPECS.glob("*.yaml")):
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        for key, value in _flatten(spec, ""):
            found.setdefault(key, (value, path.name))
    return found


def _flatten(value: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """(key path, value) for every key of a spec, in ``Key.path`` notation."""
    if not isinstance(value, dict):
        return
    for name, item in value.items():
        path = f"{prefix}{name}"
        yield path, item
        if path == "sources":
            for source in item:
                yield from _flatten(source, f"sources[{source.get('type')}].")
        elif path in ("schema", "clean.length") and isinstance(item, dict):
            for field in item.values():
                yield from _flatten(field, f"{path}.{ANY_NAME}.")
        elif isinstance(item, dict):
            yield from _flatten(item, f"{path}.")


def example_for(key: Key, shipped: dict[str, tuple[Any, str]]) -> str | None:
    if key.path in shipped:
        value, source = shipped[key.path]
        return f"`{_shortened(_yaml(value))}` ({source})"
    if key.path in EXAMPLES:
        return f"`{_shortened(_yaml(EXAMPLES[key.path]))}`"
    return None


def _shortened(text: str) -> str:
    return text if len(text) <= EXAMPLE_CHARS else text[: EXAMPLE_CHARS - 1] + "…"


# ------------------------------------------------------------------------------- document

HEADER = """\
# Dataset spec reference

Every key of a dataset spec (`slipway data build SPEC.yaml`), generated from the spec's
model in `research/data/spec.py` by

    python -m research.data.spec_reference > docs/reference/data-spec.md

and checked by a test, so it cannot drift from what the build accepts. Paths in a spec are
relative to the spec file. `<field>` stands for a field name you choose. An example marked
with a file name is what that spec in `examples/data/` sets.
"""


def render() -> str:
    """The whole reference as Markdown: one table per section, in declaration order."""
    shipped = shipped_examples()
    sections: dict[str, list[Key]] = {}
    for key in spec_keys():
        sections.setdefault(key.section, []).append(key)
    lines = [HEADER]
    for section, keys in sections.items():
        lines += [
            f"\n## {section}\n",
            "| key | type | default | description | example |",
            "|---|---|---|---|---|",
        ]
        for key in keys:
            example = "see below" if key.type.startswith("mapping (") else example_for(key, shipped)
            description = key.description.replace("<", "&lt;").replace("|", "\\|")
            cells = (f"`{key.path}`", key.type, key.default, description, example or "")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    print(render(), end="")


if __name__ == "__main__":
    main()
