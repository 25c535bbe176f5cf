"""Build any model an experiment names: the one entry point trainers and tools use."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import tf_keras as keras

from contracts.yaml_config import StrictModel, parse_model
from research.models import gpt, multitask
from research.models.configs import (
    AnyModelConfig,
    GptConfig,
    ModelConfig,
    MultiTaskConfig,
    PythonModelConfig,
)
from research.models.endpoints import assemble
from research.models.interface import conform_model
from research.models.multitask import trunk_features
from research.models.python_model import call_build_function
from research.models.specs import HeadSpec, InputSpec, check_names


class _BuildArguments(StrictModel):
    """build_model's arguments, validated together so errors carry their key paths."""

    model: ModelConfig
    inputs: dict[str, InputSpec]
    heads: dict[str, HeadSpec]


def build_model(
    config: ModelConfig | AnyModelConfig | Mapping[str, Any],
    inputs: Mapping[str, InputSpec | Mapping[str, Any]],
    heads: Mapping[str, HeadSpec | Mapping[str, Any]],
    *,
    base_dir: str | Path | None = None,
    source: str = "build_model",
) -> keras.Model:
    """A Keras model with one input per ``inputs`` key and one output per head.

    Plain mappings are validated like config files, so mistakes raise ConfigError naming
    ``source`` and the key path (``build_model: inputs.image: shape: ...``). A ``python``
    model is made by the function its ``build`` names, looked up relative to
    ``base_dir`` (the experiment file's directory), and fitted to the inputs and heads by
    ``conform_model``; zoo models are built conforming.
    """
    arguments = parse_model(
        {"model": config, "inputs": dict(inputs), "heads": dict(heads)},
        _BuildArguments,
        source=source,
    )
    family = arguments.model.root
    input_specs, head_specs = arguments.inputs, arguments.heads
    check_names(input_specs, head_specs)
    if isinstance(family, PythonModelConfig):
        model = call_build_function(
            family, input_specs, head_specs, base_dir=base_dir, source=source
        )
        return conform_model(model, input_specs, head_specs, source=f"{source}: {family.build}")
    if isinstance(family, GptConfig):
        return gpt.build(family, input_specs, head_specs)
    if isinstance(family, MultiTaskConfig):
        return multitask.build(family, input_specs, head_specs)
    return assemble(
        family.type, input_specs, head_specs, partial(trunk_features, family, specs=input_specs)
    )
