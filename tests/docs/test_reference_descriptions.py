"""Every key of a config reference has a meaning, and the descriptions kept beside a
generator name real fields that have none of their own."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from contracts.config_reference import Key, describe
from ops import analysis_reference as analysis
from research.experiments import reference as experiment
from serving import config_reference as gateway

# Each generator with a table of descriptions, and the function listing its keys.
GENERATORS: dict[str, tuple[ModuleType, Callable[[], list[Key]]]] = {
    "analysis.yaml": (analysis, analysis.analysis_keys),
    "experiment": (experiment, experiment.experiment_keys),
    "gateway.yaml": (gateway, gateway.gateway_keys),
}


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_every_key_has_a_description(name: str) -> None:
    module, keys = GENERATORS[name]
    missing = sorted({key.path for key in keys() if not describe(key, module.DESCRIPTIONS)})
    assert missing == [], f"describe these keys (a Field description or DESCRIPTIONS): {missing}"


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_descriptions_name_fields_that_have_none_of_their_own(name: str) -> None:
    module, keys = GENERATORS[name]
    fields = {(key.declared_by, key.name): key for key in keys()}
    listed = module.DESCRIPTIONS
    unknown = sorted(
        f"{cls.__name__}.{field}" for cls, field in listed if (cls, field) not in fields
    )
    assert unknown == [], "DESCRIPTIONS names fields the file does not have"
    own = sorted(f"{c.__name__}.{f}" for c, f in listed if fields[c, f].description)
    assert own == [], "these fields describe themselves: drop them from DESCRIPTIONS"
