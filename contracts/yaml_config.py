"""Load YAML files into validated pydantic models, with errors a person can act on.

A config error must name the file, the line and the dotted key path
(``spec.yaml:12: training.batch_size: expected int, got 'abc'``) because the
people editing these files are not reading Python tracebacks. Every YAML file Slipway
reads (experiment and data specs, tuning spaces, analysis configs, the gateway's
``gateway.yaml`` and its routing file) goes through this module, so they all report
mistakes the same way.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict

ModelT = TypeVar("ModelT", bound=BaseModel)
KeyLines = dict[tuple[Any, ...], int]

_EXPECTED_BY_ERROR_TYPE = {
    "int_parsing": "int",
    "int_type": "int",
    "int_from_float": "int",
    "float_parsing": "float",
    "float_type": "float",
    "bool_parsing": "bool",
    "bool_type": "bool",
    "string_type": "str",
    "list_type": "list",
    "dict_type": "mapping",
    "model_type": "mapping",
    "model_attributes_type": "mapping",
}
# Errors whose message is a config author's own sentence: the value is left for it to name.
_OWN_MESSAGE_TYPES = ("value_error", "assertion_error")


class StrictModel(BaseModel):
    """Base for config sections: unknown keys are errors, not silently ignored.

    An unknown key is answered with the section's closest key ("did you mean"), and a
    section lists the keys it once had in ``removed_keys`` (key -> what to write now), so
    a file written for an older release gets a migration hint instead of a puzzle.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    removed_keys: ClassVar[dict[str, str]] = {}


class ConfigError(ValueError):
    """A config file is unreadable or invalid; the message names file, line and key."""


def _key_lines(text: str) -> KeyLines:
    """The 1-based line of every key path in YAML ``text``."""
    lines: KeyLines = {}
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if node is not None:
        _line_map(node, (), lines)
    return lines


def _line_map(node: yaml.Node, path: tuple[Any, ...], lines: KeyLines) -> None:
    """Record the 1-based line of every key path in a composed YAML tree."""
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            _line_map(value_node, (*path, key), lines)
            lines[(*path, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _line_map(item, (*path, index), lines)


def _describe(error: dict[str, Any], sections: list[type[BaseModel]]) -> str:
    """Turn one pydantic error into 'expected X, got Y' wording where we can;
    ``sections`` are the config classes the error's key may belong to."""
    kind = error["type"]
    received = error.get("input")
    if kind == "extra_forbidden":
        return _unknown_key(str(error["loc"][-1]), sections)
    if kind == "missing":
        return "required key is missing"
    expected = _EXPECTED_BY_ERROR_TYPE.get(kind)
    if expected is not None:
        return f"expected {expected}, got {received!r}"
    if kind == "literal_error":
        allowed = error.get("ctx", {}).get("expected", "")
        return f"expected one of {allowed}, got {received!r}"
    message = error["msg"].removeprefix("Value error, ")
    if kind in _OWN_MESSAGE_TYPES or isinstance(received, dict | list):
        return message
    return f"{message}, got {received!r}"


def _format_errors(
    exc: pydantic.ValidationError, data: Any, source: str, lines: KeyLines, model: type[BaseModel]
) -> str:
    messages = []
    for error in exc.errors():
        loc = _path_in_data(error["loc"], data)
        dotted = ".".join(str(part) for part in loc) or "<root>"
        line = _nearest_line(loc, lines)
        where = f"{source}:{line}" if line else source
        sections = _sections(model, error["loc"][:-1])
        messages.append(f"{where}: {dotted}: {_describe(error, sections)}")
    return "\n".join(messages)


def _unknown_key(key: str, sections: list[type[BaseModel]]) -> str:
    """'unknown key', with what replaced a removed key or the closest known one."""
    for section in sections:
        removed = getattr(section, "removed_keys", {})
        if key in removed:
            return f"unknown key: removed; {removed[key]}"
    known = sorted(
        {name for section in sections for name in section.model_fields}
        | {f.alias for section in sections for f in section.model_fields.values() if f.alias}
    )
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f"unknown key; did you mean {close[0]!r}?" if close else "unknown key"


def _sections(model: type[BaseModel], loc: tuple[Any, ...]) -> list[type[BaseModel]]:
    """The config classes that ``loc`` (an error's location, less its last key) may end
    in. Parts that name no field (list indexes, mapping keys, union tags) stay put."""
    current = _models_in(model)
    for part in loc:
        following = [
            found
            for section in current
            for name, field in section.model_fields.items()
            if part in (name, field.alias)
            for found in _models_in(field.annotation)
        ]
        if following:
            current = following
    return current


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The config classes a field's annotation holds, through unions, lists and mappings."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.RootModel):
        return _models_in(annotation.model_fields["root"].annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    arguments = typing.get_args(annotation)
    if typing.get_origin(annotation) in (dict, Mapping):
        arguments = arguments[1:]
    elif typing.get_origin(annotation) is Annotated:
        arguments = arguments[:1]
    return [found for argument in arguments for found in _models_in(argument)]


def _path_in_data(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """Drop the location parts pydantic adds that are not keys in the file (union tags,
    ``[key]`` after a mapping key that failed validation)."""
    path: list[Any] = []
    node = data
    for index, part in enumerate(loc):
        if (
            isinstance(node, dict)
            and part in node
            or isinstance(node, list)
            and isinstance(part, int)
            and 0 <= part < len(node)
        ):
            node = node[part]
        elif isinstance(node, dict) and index == len(loc) - 1:
            pass  # a missing or unknown key: keep it, it is what the user must fix
        else:
            continue
        path.append(part)
    return tuple(path)


def _nearest_line(loc: tuple[Any, ...], lines: KeyLines) -> int | None:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


_KEY_AT_START = re.compile(r"^([A-Za-z_]\w*(?:\.\w+)+)(?=[: ])")  # a dotted key path


def located(message: str, source: str | None) -> str:
    """``message`` prefixed with ``FILE:LINE`` of the key it starts with, in config ``source``.

    Checks that need more than the file (the devices a mesh needs, a model's sizes against
    them) run after it was read, and say which key they refuse (``data.batch_size: 8 is
    not divisible …``); this points them at the file and line, as a validation error does.
    A key the file leaves at its default gets the line of its nearest section.
    """
    match = _KEY_AT_START.match(message)
    if not source or match is None or message.startswith(source):
        return message
    try:
        lines = _key_lines(Path(source).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return message
    line = _nearest_line(tuple(match.group(1).split(".")), lines)
    return f"{source}:{line}: {message}" if line else f"{source}: {message}"


def read_config_text(path: str | Path) -> str:
    """The text of a config file; a missing or unreadable file is a ConfigError naming it."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None


def parse_yaml(text: str, *, source: str) -> Any:
    """The data in YAML (or JSON) ``text``; invalid YAML is a ConfigError at its line."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: invalid YAML: {problem}") from None


def parse_model(
    data: Any, model: type[ModelT], *, source: str = "<config>", text: str = ""
) -> ModelT:
    """Validate already-parsed data; ``text`` (the YAML source) lets errors carry line numbers."""
    lines = _key_lines(text) if text else {}
    try:
        return model.model_validate(data if data is not None else {})
    except pydantic.ValidationError as exc:
        raise ConfigError(_format_errors(exc, data, source, lines, model)) from None


def load_yaml_model(path: str | Path, model: type[ModelT]) -> ModelT:
    """Read a YAML (or JSON) file into ``model``; every failure is a ConfigError.

    An empty file is an empty mapping: every key takes its default.
    """
    text = read_config_text(path)
    data = parse_yaml(text, source=str(path))
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{path}:1: <root>: expected mapping, got {type(data).__name__}")
    return parse_model(data, model, source=str(path), text=text)
