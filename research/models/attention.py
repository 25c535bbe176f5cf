"""Transformer blocks shared by the encoder classifier and the decoder language model.

Blocks are built from stock Keras layers (MultiHeadAttention, LayerNormalization,
Dense, Dropout, Add) wired functionally rather than hidden in one custom layer, so the
compression tools can wrap each Dense for pruning and quantization-aware training.

The feed-forward Dense layers see tokens as rows of a matrix ([batch * tokens,
features]) rather than sequences: a Dense over a sequence multiplies through
``tf.tensordot``, which with a free batch size computes its reshapes from the runtime
shape (SHAPE, GATHER, REDUCE_PROD, PACK ops), leaving every TFLite conversion with
dynamically shaped tensors that LiteRT re-plans on each call and XNNPACK cannot take
as one graph. Reshapes written with the static dimensions and ``-1`` for the batch have
none of that, and compute the same.
"""

from __future__ import annotations

import contextlib
from typing import Any

import tensorflow as tf
import tf_keras as keras

from research.models.configs import TransformerShape
from research.models.layers import NothingToPrune
from research.models.moe import MixtureOfExperts
from research.models.placement import OnDevice, stage_device
from research.models.recompute import Recomputed


def block_stack(x: Any, mask: Any, shape: TransformerShape, prefix: str) -> Any:
    """``shape.num_layers`` self-attention blocks over ``x`` under ``mask`` (each on its
    pipeline stage's device inside ``research.models.placement.pipeline_stages``)."""
    for index in range(shape.num_layers):
        name = f"{prefix}_block{index}"
        device = stage_device(index, shape.num_layers)
        if device is None and not shape.recompute:
            x = _block(x, mask, shape, name)
            continue
        with tf.device(device) if device else contextlib.nullcontext():
            block = _block_model(x, mask, shape, name)
        if shape.recompute:
            block = Recomputed(block, name=f"{name}_recomputed")
        if device:
            block = OnDevice(block, device, name=f"{name}_on_{_device_label(device)}")
        x = block([x, mask])
    if shape.norm == "pre":
        x = keras.layers.LayerNormalization(epsilon=1e-6, name=f"{prefix}_final_norm")(x)
    return x


def _block_model(x: Any, mask: Any, shape: TransformerShape, name: str) -> keras.Model:
    """The block as a model of its own, to be recomputed or placed as a whole.

    Its layers are the plain block's, with the same names, so only the path to them
    changes (``<name>_recomputed`` holds the ``<name>`` model, say).
    """
    block_x = keras.Input(shape=x.shape[1:], dtype=x.dtype, name=f"{name}_x")
    block_mask = keras.Input(shape=mask.shape[1:], dtype=mask.dtype, name=f"{name}_mask")
    return keras.Model([block_x, block_mask], _block(block_x, block_mask, shape, name), name=name)


def _device_label(device: str) -> str:
    """``/device:CPU:1`` as ``cpu1``, for a layer name."""
    spec = tf.DeviceSpec.from_string(device)
    return f"{(spec.device_type or 'device').lower()}{spec.device_index or 0}"


@keras.saving.register_keras_serializable(package="slipway")
class TokenRows(NothingToPrune, keras.layers.Layer):
    """[batch, tokens, features] -> [batch * tokens, features], for a Dense per token."""

    def call(self, sequences: tf.Tensor) -> tf.Tensor:
        return tf.reshape(sequences, [-1, sequences.shape[-1]])


@keras.saving.register_keras_serializable(package="slipway")
class TokenSequences(NothingToPrune, keras.layers.Layer):
    """The rows of :class:`TokenRows` back as sequences as long as ``like``'s."""

    def call(self, inputs: list[tf.Tensor]) -> tf.Tensor:
        rows, like = inputs
        tokens = like.shape[1] if like.shape[1] is not None else tf.shape(like)[1]
        return tf.reshape(rows, [-1, tokens, rows.shape[-1]])


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
        if shape.experts is not None:
            experts = shape.experts
            return MixtureOfExperts(
                experts.num_experts,
                shape.ff_dim,
                top_k=experts.top_k,
                capacity_factor=experts.capacity_factor,
                aux_loss_weight=experts.aux_loss_weight,
                name=f"{name}_experts",
            )(h)
        rows = TokenRows(name=f"{name}_ffn_rows")(h)
        rows = keras.layers.Dense(shape.ff_dim, activation="gelu", name=f"{name}_ffn_in")(rows)
        rows = keras.layers.Dense(shape.d_model, name=f"{name}_ffn_out")(rows)
        return TokenSequences(name=f"{name}_ffn_sequences")([rows, h])

    for part, sublayer in (("attention", attend), ("ffn", feed_forward)):
        norm = keras.layers.LayerNormalization(epsilon=1e-6, name=f"{name}_{part}_norm")
        residual = x
        h = norm(x) if shape.norm == "pre" else x
        h = keras.layers.Dropout(shape.dropout, name=f"{name}_{part}_dropout")(sublayer(h))
        x = keras.layers.Add(name=f"{name}_{part}_residual")([residual, h])
        if shape.norm == "post":
            x = norm(x)
    return x
