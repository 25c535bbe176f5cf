"""File-and-line messages for invalid YAML configs (gateway config, routing file).

``serving`` may not import ``research``, so the gateway keeps its own small copy of
this wording: ``gateway.yaml:12: models.digits.batching.max_batch_size: …``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import yaml

Lines = dict[tuple[Any, ...], int]


def key_lines(node: yaml.Node | None) -> Lines:
    """The 1-based line of every key path in a composed YAML document."""
    lines: Lines = {}
    if node is not None:
        _record(node, (), lines)
    return lines


def _record(node: yaml.Node, key: tuple[Any, ...], lines: Lines) -> None:
    lines[key] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            _record(value_node, (*key, key_node.value), lines)
            lines[(*key, key_node.value)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _record(item, (*key, index), lines)


def explain(error: Any, source: str, lines: Lines, *, not_keys: Collection[str] = ()) -> str:
    """One pydantic error as ``source:line: dotted.key: message``.

    ``not_keys`` are location parts pydantic adds that are not keys in the file (union
    tags, ``[key]`` for an invalid mapping key): they are left out of the path.
    """
    loc = tuple(part for part in error["loc"] if not (isinstance(part, str) and part in not_keys))
    line = next((lines[loc[:end]] for end in range(len(loc), -1, -1) if loc[:end] in lines), None)
    where = f"{source}:{line}" if line else source
    dotted = ".".join(str(part) for part in loc) or "<root>"
    kind = error["type"]
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        message = "unknown key"
    elif kind == "missing":
        message = "required key is missing"
    else:
        message = f"{error['msg'].removeprefix('Value error, ')} (got {error.get('input')!r})"
    return f"{where}: {dotted}: {message}"
