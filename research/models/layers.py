"""Custom layers the sequence models need and Keras 2 does not ship.

Each is registered under the ``slipway`` package and has a complete ``get_config`` so
``to_json``/``from_config``, ``clone_model`` and SavedModel reloading rebuild it without
``custom_objects``. Each also answers ``get_prunable_weights`` (the hook
tensorflow-model-optimization looks for on layers it does not know), so
``prune_low_magnitude`` can wrap a whole model. Token id 0 is padding throughout.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras as keras

PAD_ID = 0


@keras.saving.register_keras_serializable(package="slipway")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding plus a learned absolute position embedding.

    The position table has ``max_length`` rows: that is the longest sequence the model
    can read, and a longer one is an error rather than silently wrapped positions.
    """

    def __init__(self, vocab_size: int, max_length: int, embed_dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.embed_dim = embed_dim
        self.token_embedding = keras.layers.Embedding(vocab_size, embed_dim, name="token")
        self.position_embedding = keras.layers.Embedding(max_length, embed_dim, name="position")

    def call(self, ids: tf.Tensor) -> tf.Tensor:
        length = tf.shape(ids)[-1]
        tf.debugging.assert_less_equal(
            length,
            self.max_length,
            message=f"{self.name}: sequence is longer than max_length={self.max_length}",
        )
        return self.token_embedding(ids) + self.position_embedding(tf.range(length))

    def get_prunable_weights(self) -> list[tf.Variable]:
        # Like a stock Embedding, the token table is pruned; the small position table is not.
        return [self.token_embedding.embeddings]

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "max_length": self.max_length,
            "embed_dim": self.embed_dim,
        }


class NothingToPrune:
    """Layers whose weights (if any) are too small or too special to prune."""

    def get_prunable_weights(self) -> list[tf.Variable]:
        return []


@keras.saving.register_keras_serializable(package="slipway")
class PrependClsToken(NothingToPrune, keras.layers.Layer):
    """Put a learned [CLS] vector in front of every sequence, for [CLS] pooling."""

    def build(self, input_shape: tf.TensorShape) -> None:
        self.cls = self.add_weight(
            name="cls", shape=(int(input_shape[-1]),), initializer="random_normal", trainable=True
        )
        super().build(input_shape)

    def call(self, sequence: tf.Tensor) -> tf.Tensor:
        batch = tf.shape(sequence)[0]
        cls = tf.cast(self.cls, sequence.dtype)[tf.newaxis, tf.newaxis, :]
        return tf.concat([tf.tile(cls, [batch, 1, 1]), sequence], axis=1)


@keras.saving.register_keras_serializable(package="slipway")
class AttentionMask(NothingToPrune, keras.layers.Layer):
    """The ``(batch, query, key)`` boolean mask for MultiHeadAttention, from token ids.

    A key is visible when it is not padding; ``prefix_tokens`` leading positions that are
    not in ``ids`` (a [CLS] token) are always visible; ``causal`` also hides every key
    after the query, so position t never sees the tokens it is asked to predict.
    """

    def __init__(self, causal: bool = False, prefix_tokens: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.causal = causal
        self.prefix_tokens = prefix_tokens

    def call(self, ids: tf.Tensor) -> tf.Tensor:
        visible = tf.not_equal(ids, PAD_ID)
        if self.prefix_tokens:
            prefix = tf.ones([tf.shape(ids)[0], self.prefix_tokens], dtype=tf.bool)
            visible = tf.concat([prefix, visible], axis=1)
        length = tf.shape(visible)[1]
        mask = tf.logical_and(tf.expand_dims(visible, 1), tf.ones([length, length], dtype=tf.bool))
        if self.causal:
            lower = tf.linalg.band_part(tf.ones([length, length], dtype=tf.int32), -1, 0)
            mask = tf.logical_and(mask, tf.cast(lower, tf.bool))
        return mask

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "causal": self.causal, "prefix_tokens": self.prefix_tokens}


@keras.saving.register_keras_serializable(package="slipway")
class SequencePooling(NothingToPrune, keras.layers.Layer):
    """One vector per sequence: the mean over non-padding positions, or the [CLS] vector.

    ``mean`` needs the token ids (``ids=``) to know which positions are padding; an
    all-padding sequence pools to zeros instead of dividing by zero. Axes are added with
    ``tf.expand_dims``, never by slicing with ``tf.newaxis``: on a sequence of unknown
    length that slice is a ``StridedSlice`` LiteRT has no kernel for, so a model trained
    without ``data.sequence_length`` could not be converted.

    The mean is the total times the reciprocal of the count, not the total divided by it.
    Both are one rounding in float, but in int8 the division is one op over the pooled
    values at whatever scale the next op imposes (a concatenation with standardized
    numbers: steps far coarser than the pooled values), and LiteRT's int8 division lost
    14 points of a ticket classifier's accuracy there; the reciprocal of a small count and
    a multiplication lose none.
    """

    def __init__(self, mode: str = "mean", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if mode not in ("mean", "cls"):
            raise ValueError(f"pooling mode must be 'mean' or 'cls', got {mode!r}")
        self.mode = mode

    def call(self, sequence: tf.Tensor, ids: tf.Tensor | None = None) -> tf.Tensor:
        if self.mode == "cls":
            return sequence[:, 0]
        if ids is None:
            raise ValueError(f"{self.name}: mean pooling needs the token ids to skip padding")
        weights = tf.expand_dims(tf.cast(tf.not_equal(ids, PAD_ID), sequence.dtype), -1)
        total = tf.reduce_sum(sequence * weights, axis=1)
        count = tf.maximum(tf.reduce_sum(weights, axis=1), tf.ones([], sequence.dtype))
        return total * tf.math.reciprocal(count)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "mode": self.mode}
