"""Losses the stock Keras set lacks."""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras as keras

from research.models.layers import PAD_ID


@keras.saving.register_keras_serializable(package="slipway")
class PaddedSequenceCrossentropy(keras.losses.Loss):
    """Next-token cross-entropy averaged over real target tokens only.

    Padding targets (id 0) contribute nothing, and the mean divides by the number of real
    tokens rather than the padded length, so a batch of short sequences is not scored as
    if it were mostly correct padding. With ``reduction=NONE`` it gives one value per
    sequence, the mean over that sequence's real tokens.
    """

    def __init__(
        self,
        from_logits: bool = True,
        name: str = "padded_sequence_crossentropy",
        **kwargs: Any,
    ) -> None:
        super().__init__(name=name, **kwargs)
        self.from_logits = from_logits

    def call(self, y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
        """Per-token loss, zero at padding targets."""
        y_true = tf.cast(y_true, tf.int64)
        losses = keras.losses.sparse_categorical_crossentropy(
            y_true, tf.cast(y_pred, tf.float32), from_logits=self.from_logits
        )
        return losses * tf.cast(tf.not_equal(y_true, PAD_ID), losses.dtype)

    def __call__(
        self, y_true: tf.Tensor, y_pred: tf.Tensor, sample_weight: tf.Tensor | None = None
    ) -> tf.Tensor:
        real = tf.cast(tf.not_equal(tf.cast(y_true, tf.int64), PAD_ID), tf.float32)
        losses = self.call(y_true, y_pred)
        if self.reduction == keras.losses.Reduction.NONE:
            # One value per sequence, the mean over its real tokens (a trainer that sums
            # per-example losses over its global batch needs them unreduced).
            per_sequence = tf.math.divide_no_nan(
                tf.reduce_sum(losses, axis=-1), tf.reduce_sum(real, axis=-1)
            )
            if sample_weight is not None:
                per_sequence *= tf.cast(sample_weight, tf.float32)
            return per_sequence
        if sample_weight is not None:
            weight = tf.cast(sample_weight, tf.float32)
            while weight.shape.rank is not None and weight.shape.rank < real.shape.rank:
                weight = weight[..., tf.newaxis]
            real = real * weight
            losses = losses * weight
        return tf.math.divide_no_nan(tf.reduce_sum(losses), tf.reduce_sum(real))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "from_logits": self.from_logits}
