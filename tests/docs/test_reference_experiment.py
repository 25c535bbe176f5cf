"""The experiment reference lists every model family's keys and the keys people look for."""

from __future__ import annotations

from research.experiments.reference import experiment_keys


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
