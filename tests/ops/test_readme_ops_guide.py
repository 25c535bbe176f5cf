"""The README's table of analysis.yaml keys is checked against the analysis models, so a
key added, removed or given a new default cannot leave the Ops guide behind."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from ops.analysis import AnalysisConfig, CustomCheck, format_duration

README = Path(__file__).resolve().parents[2] / "README.md"
DURATIONS = {"window"}


def shown(key: str, value: Any) -> str:
    """A default as the README writes it."""
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return "`null`"
    if isinstance(value, BaseModel):
        return "on"
    if key in DURATIONS:
        return f"`{format_duration(value)}`"
    if isinstance(value, list):
        return "`[]`" if not value else f"`{value}`"
    return f"`{value}`"


def documented_keys(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(dotted key, default)`` for every key of an analysis file, depth first."""
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        default = field.get_default(call_default_factory=True)
        if not isinstance(default, BaseModel) or type(None) in get_args(field.annotation):
            yield key, shown(name, default)  # a section that cannot be null has no value
        if isinstance(default, BaseModel):
            yield from documented_keys(type(default), f"{key}.")
        elif name == "custom":
            yield from documented_keys(CustomCheck, f"{key}[].")


def readme_keys() -> list[tuple[str, str]]:
    text = README.read_text(encoding="utf-8")
    table = text.split("<!-- analysis keys -->")[1].split("<!-- /analysis keys -->")[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    return [tuple(cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:3]) for row in rows]


def test_every_analysis_key_and_default_is_in_the_ops_guide() -> None:
    expected = [(f"`{key}`", default) for key, default in documented_keys(AnalysisConfig)]
    table = "\n".join(f"| {key} | {default} |" for key, default in expected)
    assert readme_keys() == expected, f"the README's table should list:\n{table}"
