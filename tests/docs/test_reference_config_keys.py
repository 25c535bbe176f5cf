"""The key walk every config reference page is printed from: paths, types and defaults."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, PositiveInt, RootModel

from contracts.config_reference import Key, cell, config_keys, docstring, render_sections


@dataclass(frozen=True)
class Policy:
    """A dataclass section, read the way pydantic reads it."""

    kind: Literal["latest", "all"] = "latest"
    versions: tuple[int, ...] = ()


class Csv(BaseModel):
    type: Literal["csv"] = "csv"
    path: Path


class Jsonl(BaseModel):
    type: Literal["jsonl"] = "jsonl"
    rename: dict[str, str] = {}


Source = Annotated[Csv | Jsonl, Field(discriminator="type")]


class Dense(BaseModel):
    type: Literal["dense"] = "dense"
    units: list[PositiveInt] = [8]


class Conv(BaseModel):
    type: Literal["conv"] = "conv"
    window: tuple[int, int] = (3, 3)


class Family(RootModel[Annotated[Dense | Conv, Field(discriminator="type")]]):
    """A tagged mapping wrapped in a root model, as a model zoo's config is."""


class Check(BaseModel):
    name: str = Field(pattern=r"^\w+$")
    max: float | None = None


class Head(BaseModel):
    weight: float = Field(default=1.0, ge=0, description="loss weight")


class Config(BaseModel):
    name: str
    sources: list[Source] = Field(min_length=1)
    model: Family | None = None
    heads: dict[str, Head] = {}
    checks: list[Check] = []
    policy: Policy = Policy()
    hidden: str = Field(default="x", exclude=True)


def keys_by_path() -> dict[str, Key]:
    return {key.path: key for key in config_keys(Config)}


def test_paths_are_written_as_a_file_author_writes_them() -> None:
    assert [(key.section, key.path) for key in config_keys(Config)] == [
        ("Top level", "name"),
        ("Top level", "sources"),
        ("sources: type csv", "sources[csv].path"),
        ("sources: type jsonl", "sources[jsonl].rename"),
        ("Top level", "model"),
        ("model: type dense", "model.units"),
        ("model: type conv", "model.window"),
        ("Top level", "heads"),
        ("heads", "heads.<name>.weight"),
        ("Top level", "checks"),
        ("checks[]", "checks[].name"),
        ("checks[]", "checks[].max"),
        ("Top level", "policy"),
        ("policy", "policy.kind"),
        ("policy", "policy.versions"),
    ]


def test_types_carry_their_constraints() -> None:
    keys = keys_by_path()
    assert (
        keys["sources"].type
        == "list of mapping (see below; `type`: `csv`, `jsonl`), at least 1 long"
    )
    assert keys["sources[csv].path"].type == "path"
    assert keys["model"].type == "mapping (see below; `type`: `dense`, `conv`) or null"
    assert keys["model.units"].type == "list of integer (> 0)"
    assert keys["model.window"].type == "[integer, integer]"
    assert keys["heads.<name>.weight"].type == "number, ≥ 0"
    assert keys["checks[].name"].type == "string, matching `^\\w+$`"
    assert keys["policy.kind"].type == "one of `latest`, `all`"
    assert keys["policy.versions"].type == "list of integer"


def test_defaults_are_written_as_yaml() -> None:
    keys = keys_by_path()
    assert keys["name"].default == "required"
    assert keys["model"].default == "`null`"
    assert keys["model.window"].default == "`[3, 3]`"
    assert keys["heads"].default == "`{}`"
    assert keys["policy"].default == "(the defaults below)"
    assert keys["policy.versions"].default == "`[]`"


def test_a_key_with_keys_below_it_says_so() -> None:
    nested = {key.path for key in config_keys(Config) if key.nested}
    assert nested == {"sources", "model", "heads", "checks", "policy"}


def test_the_chosen_name_of_a_mapping_key_can_be_named() -> None:
    paths = [key.path for key in config_keys(Config, any_name="<head>")]
    assert "heads.<head>.weight" in paths


def test_sections_render_as_tables_in_order_with_an_intro() -> None:
    columns = (("key", lambda key: f"`{key.path}`"), ("meaning", lambda key: key.description))
    lines = render_sections(
        config_keys(Head), columns, intro=lambda keys: f"declared by {keys[0].owner.__name__}"
    )
    assert lines == [
        "\n## Top level\n",
        "declared by Head\n",
        "| key | meaning |",
        "|---|---|",
        "| `weight` | loss weight |",
    ]


def test_text_stays_in_its_cell_and_docstrings_become_markdown() -> None:
    assert cell("a | b\n  <name>") == "a \\| b &lt;name>"
    assert (
        docstring(Family) == "A tagged mapping wrapped in a root model, as a model zoo's config is."
    )
    assert docstring(Check) is None
