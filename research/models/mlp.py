"""Multi-layer perceptron over any mix of numeric, image, categorical and token inputs.

Numeric and image inputs are flattened, categorical ids get a learned embedding, token
sequences become the masked mean of their token embeddings (a bag of words); all of
them are concatenated into one vector before the hidden layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tf_keras as keras

from research.models.configs import MlpConfig
from research.models.endpoints import Tensors
from research.models.layers import SequencePooling
from research.models.specs import InputSpec


def features(config: MlpConfig, tensors: Tensors, specs: Mapping[str, InputSpec]) -> Any:
    """The last hidden layer's output: the trunk the heads sit on."""
    parts = [_encode(config, name, tensors[name], spec) for name, spec in specs.items()]
    x = parts[0] if len(parts) == 1 else keras.layers.Concatenate(name="mlp_features")(parts)
    for index, units in enumerate(config.hidden_units):
        # With batch norm right after, the Dense bias is redundant (BN's beta shifts instead).
        x = keras.layers.Dense(units, use_bias=not config.batch_norm, name=f"mlp_dense_{index}")(x)
        if config.batch_norm:
            x = keras.layers.BatchNormalization(
                momentum=config.batch_norm_momentum, name=f"mlp_batch_norm_{index}"
            )(x)
        x = keras.layers.Activation(config.activation, name=f"mlp_activation_{index}")(x)
        if config.dropout:
            x = keras.layers.Dropout(config.dropout, name=f"mlp_dropout_{index}")(x)
    return x


def _encode(config: MlpConfig, name: str, tensor: Any, spec: InputSpec) -> Any:
    if spec.kind in ("categorical", "tokens"):
        embedded = keras.layers.Embedding(
            spec.vocab_size, config.embedding_dim, name=f"{name}_embedding"
        )(tensor)
        if spec.kind == "tokens":
            return SequencePooling("mean", name=f"{name}_pooling")(embedded, ids=tensor)
        return keras.layers.Flatten(name=f"{name}_flatten")(embedded)
    return keras.layers.Flatten(name=f"{name}_flatten")(tensor)
