"""Reference tables of a config file's keys, read from the models that validate the file.

Every YAML file Slipway reads is loaded into a pydantic model (``contracts.yaml_config``),
so the models are the one complete list of its keys, their types, constraints and
defaults. The generated reference pages (the dataset spec, experiments, ``gateway.yaml``,
``analysis.yaml``) walk a model with ``config_keys`` and print the keys with
``render_reference`` (``render_sections`` for a page with columns of its own): a key
added, renamed or given another default changes the page, and the page's test fails
until it is regenerated.

A key's path is written as a file author writes it: ``clean.pii.kinds``; ``<name>`` for
a key the author chooses (a mapping's key); ``sources[csv].path`` for a key of the list
items whose ``type`` is ``csv``; ``checks.custom[].name`` for a key of every list item.
A key of a mapping picked by a tag (``model: {type: cnn, ...}``) keeps the plain path and
is listed under its own heading, ``model: type cnn``.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import annotated_types
import yaml
from pydantic import BaseModel, RootModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

TOP_LEVEL = "Top level"
NESTED = "mapping (see below)"  # the type of a key whose own keys follow under its heading


@dataclass(frozen=True)
class Key:
    """One key of a config file, as a row of its reference."""

    path: str  # "clean.pii.kinds", "sources[csv].path", "models.<name>.batching"
    name: str  # the field's name in the model that declares it
    section: str  # the heading it is listed under
    type: str
    default: str
    description: str
    field: FieldInfo
    owner: type  # the model (or dataclass) that declares it
    nested: bool  # its own keys follow, under headings of their own

    @property
    def declared_by(self) -> type:
        """The class whose body declares the field: a base the owner shares with others."""
        return next(
            c for c in self.owner.__mro__ if self.name in vars(c).get("__annotations__", {})
        )


def config_keys(model: type, *, any_name: str = "<name>", section: str = TOP_LEVEL) -> list[Key]:
    """Every key of ``model`` and of the sections below it, depth first, in declaration
    order. ``any_name`` stands for the keys of a mapping the file's author names. A
    section that two tagged mappings share (``model.experts`` of both Transformer
    families) is listed once."""
    unique = {(key.section, key.path): key for key in _keys(model, "", section, any_name, None)}
    return list(unique.values())


def _keys(model: type, prefix: str, section: str, any_name: str, skip: str | None) -> Iterator[Key]:
    for name, field in _fields(model).items():
        if field.exclude or name == skip:
            continue
        path = prefix + (field.alias or name)
        below = list(_below(field.annotation, field.discriminator, path, any_name))
        yield Key(
            path=path,
            name=name,
            section=section,
            type=field_type(field),
            default=field_default(field),
            description=field.description or "",
            field=field,
            owner=model,
            nested=bool(below),
        )
        yield from below


def _fields(model: type) -> dict[str, FieldInfo]:
    """A pydantic model's fields, or a dataclass's as pydantic reads them."""
    if _is_model(model):
        return dict(model.model_fields)
    hints = typing.get_type_hints(model, include_extras=True)
    return {
        item.name: FieldInfo.from_annotated_attribute(
            hints[item.name],
            PydanticUndefined if item.default is dataclasses.MISSING else item.default,
        )
        for item in dataclasses.fields(model)
    }


def _below(annotation: Any, discriminator: Any, path: str, any_name: str) -> Iterator[Key]:
    """The keys nested in a value of type ``annotation`` written at ``path``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        tags = [item.discriminator for item in args[1:] if isinstance(item, FieldInfo)]
        yield from _below(args[0], next(filter(None, tags), discriminator), path, any_name)
    elif origin in (typing.Union, types.UnionType):
        members = [arg for arg in args if arg is not type(None)]
        if isinstance(discriminator, str):
            for member in members:
                tag = _tag(member, discriminator)
                # Items of a list are told apart in the path; a single mapping by heading.
                prefix = f"{path.removesuffix('[]')}[{tag}]." if path.endswith("[]") else f"{path}."
                heading = f"{path.removesuffix('[]')}: {discriminator} {tag}"
                yield from _keys(member, prefix, heading, any_name, skip=discriminator)
        else:
            for member in members:
                yield from _below(member, None, path, any_name)
    elif _is_root_model(annotation):
        root = annotation.model_fields["root"]
        yield from _below(root.annotation, root.discriminator, path, any_name)
    elif _is_structure(annotation):
        yield from _keys(annotation, f"{path}.", path, any_name, skip=None)
    elif origin is dict:
        for key in _below(args[1], None, f"{path}.{any_name}", any_name):
            # The keys of every named entry are listed under the mapping's own heading.
            yield (
                dataclasses.replace(key, section=path)
                if key.section == f"{path}.{any_name}"
                else key
            )
    elif origin in (list, tuple) and args:
        yield from _below(args[0], None, f"{path}[]", any_name)


def _tag(member: type, discriminator: str) -> str:
    """The value of the discriminating key that picks ``member`` out of a union."""
    return typing.get_args(member.model_fields[discriminator].annotation)[0]


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _is_root_model(annotation: Any) -> bool:
    return _is_model(annotation) and issubclass(annotation, RootModel)


def _is_structure(annotation: Any) -> bool:
    """A mapping of named keys: a pydantic model or a dataclass."""
    is_dataclass = isinstance(annotation, type) and dataclasses.is_dataclass(annotation)
    return _is_model(annotation) or is_dataclass


# ---------------------------------------------------------------------------------- types


def field_type(field: FieldInfo) -> str:
    """A field's type as a config author reads it, with its constraints: ``integer, ≥ 0``."""
    limits = [limit for limit in map(_constraint, field.metadata) if limit]
    return ", ".join([type_name(field.annotation, field.discriminator), *limits])


def type_name(annotation: Any, discriminator: Any = None) -> str:
    """``list of string``, ``one of `csv`, `jsonl```, ``mapping (see below) or null``; a
    mapping picked by a tag names the tag's values: ``mapping (see below; `kind`: `local`,
    `remote`)``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return "one of " + ", ".join(f"`{yaml_value(arg)}`" for arg in args)
    if origin in (typing.Union, types.UnionType):
        members = [arg for arg in args if arg is not type(None)]
        if isinstance(discriminator, str):
            tags = ", ".join(f"`{_tag(member, discriminator)}`" for member in members)
            tagged = f"{NESTED.removesuffix(')')}; `{discriminator}`: {tags})"
            return tagged + (" or null" if len(members) < len(args) else "")
        return " or ".join(dict.fromkeys(type_name(arg) for arg in args))
    if origin is typing.Annotated:
        tags = [item.discriminator for item in args[1:] if isinstance(item, FieldInfo)]
        limits = [limit for item in args[1:] for limit in _constraints(item)]
        named = type_name(args[0], next(filter(None, tags), discriminator))
        return named + (f" ({', '.join(limits)})" if limits else "")
    if origin is tuple and args and args[-1] is not Ellipsis:
        return "[" + ", ".join(map(type_name, args)) + "]"  # a fixed length: [min, max]
    if origin in (list, tuple):
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping of {type_name(args[0])} to {type_name(args[1])}"
    if _is_root_model(annotation):
        root = annotation.model_fields["root"]
        return type_name(root.annotation, root.discriminator)
    if _is_structure(annotation):
        return NESTED
    names = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}
    if annotation is Any:
        return "any"
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _constraints(item: Any) -> list[str]:
    """The constraints an ``Annotated`` item carries (a ``Field(...)`` may carry several)."""
    items = item.metadata if isinstance(item, FieldInfo) else [item]
    return [limit for limit in map(_constraint, items) if limit]


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


# ------------------------------------------------------------------------------- defaults


def field_default(field: FieldInfo) -> str:
    """``required``, the default as YAML, or ``(the defaults below)`` for a section."""
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.get_default(call_default_factory=True)
    if _is_model(type(value)) or dataclasses.is_dataclass(value):
        return "(the defaults below)"
    return f"`{yaml_value(value)}`"


def yaml_value(value: Any) -> str:
    """A value as it is written in a config file, on one line."""
    plain = to_jsonable_python(value)
    text = yaml.safe_dump(plain, default_flow_style=True, sort_keys=False, width=10_000)
    return text.strip().removesuffix("...").strip().replace("|", "\\|")


# ------------------------------------------------------------------------------ rendering


def cell(text: str) -> str:
    """Text that stays inside one cell of a Markdown table and shows ``<`` as written."""
    return " ".join(text.split()).replace("<", "&lt;").replace("|", "\\|")


def _declares_keys(cls: type, owner: type) -> bool:
    """Whether ``cls`` annotates one of ``owner``'s config keys (a ``ClassVar`` is none)."""
    keys = getattr(owner, "model_fields", {})
    return any(name in keys for name in vars(cls).get("__annotations__", {}))


def docstring(owner: type) -> str | None:
    """The docstrings of a class and of the bases that declare some of its keys, as
    Markdown (None when none has one): a family's config says what it adds, the shape
    it shares with another family says the rest."""
    texts = [
        inspect.cleandoc(cls.__dict__["__doc__"])
        for cls in owner.__mro__
        if cls.__dict__.get("__doc__")
        and (cls is owner or _declares_keys(cls, owner))
        and cls.__module__ not in ("builtins", "pydantic.main", "pydantic.root_model")
    ]
    text = "\n\n".join(texts)
    return re.sub(r"``([^`]+)``", r"`\1`", text).replace("<", "&lt;") if texts else None


def _sections(keys: Sequence[Key]) -> dict[str, list[Key]]:
    """The keys under each heading, headings in the order their first key comes."""
    grouped: dict[str, list[Key]] = {}
    for key in keys:
        grouped.setdefault(key.section, []).append(key)
    return grouped


def render_sections(
    keys: Sequence[Key],
    columns: Sequence[tuple[str, Callable[[Key], str]]],
    intro: Callable[[list[Key]], str | None] = lambda keys: None,
) -> list[str]:
    """One Markdown table per heading; ``columns`` names each column and fills its cells,
    ``intro`` may put a paragraph between a heading and its table."""
    lines: list[str] = []
    for section, section_keys in _sections(keys).items():
        lines.append(f"\n## {section.replace('<', '&lt;')}\n")  # a heading, not a tag
        paragraph = intro(section_keys)
        if paragraph:
            lines.append(paragraph + "\n")
        lines += [
            "| " + " | ".join(name for name, _ in columns) + " |",
            "|" + "---|" * len(columns),
        ]
        lines += [
            "| " + " | ".join(fill(key) for _, fill in columns) + " |" for key in section_keys
        ]
    return lines


def describe(key: Key, descriptions: Mapping[tuple[type, str], str]) -> str:
    """The field's own description, else its entry in ``descriptions``, keyed by the class
    that declares the field (so a field several sections share is described once); ""
    if neither has one."""
    return key.description or descriptions.get((key.declared_by, key.name), "")


def render_reference(
    header: str, keys: Sequence[Key], descriptions: Mapping[tuple[type, str], str]
) -> str:
    """A whole reference page: the header, then a key, type, default and description table
    per section, with the section's model docstring above it the first time the model comes
    (a section that repeats a model, such as a multi-task trunk's family, is not told twice)."""
    told: set[type] = set()

    def intro(section_keys: list[Key]) -> str | None:
        owner = section_keys[0].owner
        first = owner not in told
        told.add(owner)
        return docstring(owner) if first else None

    columns = (
        ("key", lambda key: f"`{key.path}`"),
        ("type", lambda key: key.type),
        ("default", lambda key: key.default),
        ("description", lambda key: cell(describe(key, descriptions))),
    )
    return "\n".join([header, *render_sections(keys, columns, intro)]) + "\n"
