"""The experiment reference lists every family's keys, each with a meaning."""

from __future__ import annotations

from research.experiments.reference import DESCRIPTIONS, description, experiment_keys


def test_every_family_and_the_keys_people_look_for_are_listed() -> None:
    keys = experiment_keys()
    sections = {key.section for key in keys}
    families = ("mlp", "cnn", "transformer", "gpt", "multitask", "python")
    assert {f"model: type {family}" for family in families} <= sections
    paths = {key.path for key in keys}
    wanted = {
        "data.sequence_length",
        "data.features",
        "training.deterministic",
        "model.recompute",
        "model.experts.num_experts",
        "model.trunk.hidden_units",
        "model.build",
        "heads.<head>.kind",
        "distribution.mesh.model",
    }
    assert wanted <= paths


def test_every_key_has_a_description() -> None:
    missing = sorted({key.path for key in experiment_keys() if not description(key)})
    assert missing == [], f"describe these keys (Field description or DESCRIPTIONS): {missing}"


def test_descriptions_name_fields_that_have_none_of_their_own() -> None:
    keys = {(key.declared_by, key.name): key for key in experiment_keys()}
    unknown = sorted(
        f"{cls.__name__}.{name}" for cls, name in DESCRIPTIONS if (cls, name) not in keys
    )
    assert unknown == [], "DESCRIPTIONS names fields no experiment has"
    shadowing = sorted(f"{c.__name__}.{n}" for c, n in DESCRIPTIONS if keys[c, n].description)
    assert shadowing == [], "these fields describe themselves: drop them from DESCRIPTIONS"
