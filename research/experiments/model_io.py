"""The model an experiment trains on its dataset: named inputs and heads, and the
batches that feed them.

Both the trainer and the hyper-parameter search derive the model's interface with these
rules, so a config that tunes is a config that trains.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from research.configs import ConfigError
from research.data.manifest import Manifest
from research.experiments.config import ExperimentConfig
from research.models.gpt import next_token_pairs
from research.models.specs import (
    HeadSpec,
    InputSpec,
    head_spec_from_feature,
    input_spec_from_feature,
)


@dataclass(frozen=True)
class ModelIO:
    """The named inputs and heads an experiment's model has on its dataset."""

    inputs: dict[str, InputSpec]
    heads: dict[str, HeadSpec]

    @property
    def language_model(self) -> bool:
        return any(head.kind == "language_model" for head in self.heads.values())

    @property
    def lm_input(self) -> str:
        return next(iter(self.inputs))

    @property
    def lm_head(self) -> str:
        return next(iter(self.heads))


def model_io(config: ExperimentConfig, manifest: Manifest, source: str = "experiment") -> ModelIO:
    """Inputs and heads derived from the manifest by the trainer's rules.

    Inputs are ``data.features`` (default: every feature that is not a label); heads are
    the experiment's ``heads`` or one per ``data.labels`` (default: every label),
    weighted by ``training.loss_weights``. A ConfigError names ``source`` and the key.
    """
    features = manifest.features
    inputs_available = [name for name, spec in features.items() if not spec.is_label]
    wanted = config.data.features or inputs_available
    unknown = [name for name in wanted if name not in inputs_available]
    if unknown:
        raise ConfigError(
            f"{source}: data.features: not input features of the dataset: {unknown} "
            f"(inputs: {inputs_available})"
        )
    inputs = {
        name: input_spec_from_feature(features[name], sequence_length=config.data.sequence_length)
        for name in wanted
    }
    if config.heads is not None:
        heads = dict(config.heads)
    else:
        labels = config.data.labels or list(manifest.labels)
        unknown = [name for name in labels if name not in manifest.labels]
        if unknown:
            raise ConfigError(
                f"{source}: data.labels: not labels of the dataset: {unknown} "
                f"(labels: {manifest.labels})"
            )
        weights = config.training.loss_weights
        heads = {
            name: head_spec_from_feature(features[name], loss_weight=weights.get(name, 1.0))
            for name in labels
        }
    if not heads:
        raise ConfigError(
            f"{source}: heads: the dataset has no labels; name heads in the experiment"
        )
    io = ModelIO(inputs=inputs, heads=heads)
    if io.language_model:
        if [spec.kind for spec in inputs.values()] != ["tokens"]:
            raise ConfigError(
                f"{source}: heads: a language_model head needs exactly one text input "
                "(data.features)"
            )
    else:
        missing = [name for name in heads if name not in manifest.labels]
        if missing:
            raise ConfigError(f"{source}: heads: the dataset has no labels {missing}")
    unknown = sorted(set(config.training.loss_weights) - set(heads))
    if unknown:
        raise ConfigError(f"{source}: training.loss_weights: no such heads: {unknown}")
    return io


def as_head_labels(io: ModelIO) -> Callable[..., Any]:
    """Batch elements -> ``(features, {head: labels})``; next-token pairs for a language model."""
    heads = list(io.heads)
    first_input = next(iter(io.inputs))

    def convert(features: Mapping[str, tf.Tensor], labels: Any = None) -> Any:
        if io.language_model:
            inputs, targets = next_token_pairs(features[first_input])
            return {first_input: inputs}, {heads[0]: targets}
        if not isinstance(labels, Mapping):
            labels = {heads[0]: labels}
        return features, {name: labels[name] for name in heads}

    return convert
