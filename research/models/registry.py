"""Build any zoo model from its config: the one entry point trainers and tools use."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import tf_keras as keras
from pydantic import RootModel

from research.configs import StrictModel, parse_model
from research.models import gpt, multitask
from research.models.cnn import CnnConfig
from research.models.config_types import tagged_union
from research.models.endpoints import assemble
from research.models.gpt import GptConfig
from research.models.mlp import MlpConfig
from research.models.multitask import MultiTaskConfig, trunk_features
from research.models.specs import HeadSpec, InputSpec, check_names
from research.models.transformer import TransformerConfig

AnyModelConfig = MlpConfig | CnnConfig | TransformerConfig | GptConfig | MultiTaskConfig


class ModelConfig(
    RootModel[tagged_union(MlpConfig, CnnConfig, TransformerConfig, GptConfig, MultiTaskConfig)]
):
    """A model section of an experiment file: ``{type: cnn, stages: [16, 32], ...}``.

    Use it as a field type (``model: ModelConfig``) or validate a mapping with
    ``research.configs.parse_model(data, ModelConfig)``; the family config is ``.root``.
    """


class _BuildArguments(StrictModel):
    """build_model's arguments, validated together so errors carry their key paths."""

    model: ModelConfig
    inputs: dict[str, InputSpec]
    heads: dict[str, HeadSpec]


def build_model(
    config: ModelConfig | AnyModelConfig | Mapping[str, Any],
    inputs: Mapping[str, InputSpec | Mapping[str, Any]],
    heads: Mapping[str, HeadSpec | Mapping[str, Any]],
) -> keras.Model:
    """A functional Keras model with one input per ``inputs`` key and one output per head.

    Plain mappings are validated like config files, so mistakes raise ConfigError naming
    the key path (``build_model: inputs.image: shape: ...``).
    """
    arguments = parse_model(
        {"model": config, "inputs": dict(inputs), "heads": dict(heads)},
        _BuildArguments,
        source="build_model",
    )
    family = arguments.model.root
    input_specs, head_specs = arguments.inputs, arguments.heads
    check_names(input_specs, head_specs)
    if isinstance(family, GptConfig):
        return gpt.build(family, input_specs, head_specs)
    if isinstance(family, MultiTaskConfig):
        return multitask.build(family, input_specs, head_specs)
    return assemble(
        family.type, input_specs, head_specs, partial(trunk_features, family, specs=input_specs)
    )
