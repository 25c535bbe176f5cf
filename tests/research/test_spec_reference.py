"""Every key of the dataset spec reference has a valid example (the page itself is checked
against its generator with the other reference pages, in tests/docs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pytest
import yaml
from pydantic import TypeAdapter

from contracts.config_reference import NESTED
from research.data.spec import DatasetSpec
from research.data.spec_reference import (
    EXAMPLE_SPECS,
    EXAMPLES,
    Key,
    example_for,
    shipped_examples,
    spec_keys,
)


def test_every_key_is_listed_with_an_example() -> None:
    shipped = shipped_examples()
    keys = spec_keys()
    assert {"name", "sources[csv].header", "clean.pii.phone_regions"} <= {k.path for k in keys}
    sections = [key for key in keys if key.type.startswith(NESTED)]
    missing = [k.path for k in keys if k not in sections and example_for(k, shipped) is None]
    assert missing == [], f"give these keys an example in spec_reference.EXAMPLES: {missing}"


def test_listed_examples_are_real_keys_that_no_shipped_spec_sets() -> None:
    paths = {key.path for key in spec_keys()}
    assert sorted(set(EXAMPLES) - paths) == []
    assert sorted(set(EXAMPLES) & set(shipped_examples())) == []


@pytest.mark.parametrize(
    "key", [k for k in spec_keys() if k.path in EXAMPLES], ids=lambda key: key.path
)
def test_listed_examples_are_valid_values(key: Key) -> None:
    # The field's own constraints (ge, pattern, ...) travel in its FieldInfo.
    TypeAdapter(Annotated[key.field.annotation, key.field]).validate_python(EXAMPLES[key.path])


@pytest.mark.parametrize("path", sorted(EXAMPLE_SPECS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_example_specs_are_valid(path: Path) -> None:
    DatasetSpec.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
