"""Transformer encoder over token ids, pooled to one vector for classification.

Token plus learned position embeddings, self-attention blocks that never attend to
padding (id 0), then the masked mean of the outputs or a learned [CLS] token's output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tf_keras as keras

from research.models.attention import block_stack
from research.models.configs import TransformerConfig
from research.models.endpoints import Tensors, only_input
from research.models.layers import (
    AttentionMask,
    PrependClsToken,
    SequencePooling,
    TokenAndPositionEmbedding,
)
from research.models.specs import InputSpec


def features(config: TransformerConfig, tensors: Tensors, specs: Mapping[str, InputSpec]) -> Any:
    """The pooled encoder output."""
    name = only_input(specs, ("tokens",), "transformer")
    spec = specs[name]
    ids = tensors[name]
    x = TokenAndPositionEmbedding(
        spec.vocab_size,
        config.position_table_size(name, spec),
        config.d_model,
        name="encoder_embedding",
    )(ids)
    cls = config.pooling == "cls"
    if cls:
        x = PrependClsToken(name="encoder_cls")(x)
    x = keras.layers.Dropout(config.dropout, name="encoder_embedding_dropout")(x)
    mask = AttentionMask(prefix_tokens=int(cls), name="encoder_mask")(ids)
    x = block_stack(x, mask, config, "encoder")
    if cls:
        return SequencePooling("cls", name="encoder_pooling")(x)
    return SequencePooling("mean", name="encoder_pooling")(x, ids=ids)
