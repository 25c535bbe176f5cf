"""Transformer blocks shared by the encoder classifier and the decoder language model.

Blocks are built from stock Keras layers (MultiHeadAttention, LayerNormalization,
Dense, Dropout, Add) wired functionally rather than hidden in one custom layer, so the
compression tools can wrap each Dense for pruning and quantization-aware training.
"""

from __future__ import annotations

from typing import Any

import tf_keras as keras

from research.models.configs import TransformerShape


def block_stack(x: Any, mask: Any, shape: TransformerShape, prefix: str) -> Any:
    """``shape.num_layers`` self-attention blocks over ``x`` under ``mask``."""
    for index in range(shape.num_layers):
        x = _block(x, mask, shape, f"{prefix}_block{index}")
    if shape.norm == "pre":
        x = keras.layers.LayerNormalization(epsilon=1e-6, name=f"{prefix}_final_norm")(x)
    return x


def _block(x: Any, mask: Any, shape: TransformerShape, name: str) -> Any:
    attention = keras.layers.MultiHeadAttention(
        num_heads=shape.num_heads,
        key_dim=shape.d_model // shape.num_heads,
        dropout=shape.dropout,
        name=f"{name}_attention",
    )

    def attend(h: Any) -> Any:
        return attention(h, h, attention_mask=mask)

    def feed_forward(h: Any) -> Any:
        h = keras.layers.Dense(shape.ff_dim, activation="gelu", name=f"{name}_ffn_in")(h)
        return keras.layers.Dense(shape.d_model, name=f"{name}_ffn_out")(h)

    for part, sublayer in (("attention", attend), ("ffn", feed_forward)):
        norm = keras.layers.LayerNormalization(epsilon=1e-6, name=f"{name}_{part}_norm")
        residual = x
        h = norm(x) if shape.norm == "pre" else x
        h = keras.layers.Dropout(shape.dropout, name=f"{name}_{part}_dropout")(sublayer(h))
        x = keras.layers.Add(name=f"{name}_{part}_residual")([residual, h])
        if shape.norm == "post":
            x = norm(x)
    return x
