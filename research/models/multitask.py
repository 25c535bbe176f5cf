"""One shared trunk, one head per label.

The trunk is any pooled-feature family (mlp, cnn, transformer); each label gets its own
small hidden tower before its output so tasks can specialise on shared features.
Per-task loss weights live in each HeadSpec (``loss_weight``) and reach ``compile``
through ``compile_args``.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import tf_keras as keras

from research.models import cnn, mlp, transformer
from research.models.configs import MultiTaskConfig
from research.models.endpoints import Tensors, assemble
from research.models.specs import HeadSpec, InputSpec

_FEATURES = {"mlp": mlp.features, "cnn": cnn.features, "transformer": transformer.features}


def trunk_features(config: Any, tensors: Tensors, specs: Mapping[str, InputSpec]) -> Any:
    """Pooled features of whichever trunk family ``config`` names."""
    return _FEATURES[config.type](config, tensors, specs)


def build(
    config: MultiTaskConfig, inputs: Mapping[str, InputSpec], heads: Mapping[str, HeadSpec]
) -> keras.Model:
    """The trunk's features feed one tower and output per head."""
    return assemble(
        "multitask",
        inputs,
        heads,
        partial(trunk_features, config.trunk, specs=inputs),
        tower_units=config.head_hidden_units,
        tower_activation=config.head_activation,
        tower_dropout=config.head_dropout,
    )
