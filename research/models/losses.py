"""Losses and metrics the stock Keras set lacks.

Every loss here gives one value per example with ``reduction=NONE``: a trainer that sums
per-example losses over its global batch (and divides once) relies on that shape.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras as keras

from research.models.layers import PAD_ID


@keras.saving.register_keras_serializable(package="slipway")
class PaddedSequenceCrossentropy(keras.losses.Loss):
    """Next-token cross-entropy of each sequence, averaged over its real target tokens.

    Padding targets (id 0) contribute nothing, and each sequence's mean divides by its
    number of real tokens rather than the padded length, so a batch of short sequences is
    not scored as if it were mostly correct padding. The per-example value is that mean,
    and a batch's loss is the mean over its sequences: exactly what a trainer that sums
    per-example losses over its global batch computes, so ``model.fit`` and the trainer
    agree on every batch.
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
        """One value per sequence: the mean loss over its real target tokens."""
        y_true = tf.cast(y_true, tf.int64)
        losses = keras.losses.sparse_categorical_crossentropy(
            y_true, tf.cast(y_pred, tf.float32), from_logits=self.from_logits
        )
        real = tf.cast(tf.not_equal(y_true, PAD_ID), losses.dtype)
        return tf.math.divide_no_nan(
            tf.reduce_sum(losses * real, axis=-1), tf.reduce_sum(real, axis=-1)
        )

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "from_logits": self.from_logits}


def aligned_targets(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    """Regression targets in the prediction's shape and dtype.

    A scalar numeric label arrives as ``[batch]`` while its head predicts ``[batch, 1]``;
    Keras' stock regression losses then squeeze the prediction and average over the last
    axis, which is the batch: one number per batch instead of one per example.
    """
    return tf.reshape(tf.cast(y_true, y_pred.dtype), tf.shape(y_pred))


def _per_example_mean(values: tf.Tensor) -> tf.Tensor:
    """``[batch, ...]`` -> ``[batch]``: the mean over each example's values."""
    return tf.reduce_mean(tf.reshape(values, [tf.shape(values)[0], -1]), axis=-1)


@keras.saving.register_keras_serializable(package="slipway")
class RegressionMeanSquaredError(keras.losses.Loss):
    """Mean squared error over each example's predicted values, whatever the label's rank."""

    def __init__(self, name: str = "mean_squared_error", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)

    def call(self, y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
        y_pred = tf.cast(y_pred, tf.float32)
        return _per_example_mean(
            tf.math.squared_difference(aligned_targets(y_true, y_pred), y_pred)
        )


@keras.saving.register_keras_serializable(package="slipway")
class RegressionMeanAbsoluteError(keras.metrics.Mean):
    """Mean absolute error over every predicted value, with the label aligned to the head.

    Sample weights may be per example (``[batch]``) or per value (the label's shape).
    """

    def __init__(self, name: str = "mae", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)

    def update_state(
        self, y_true: tf.Tensor, y_pred: tf.Tensor, sample_weight: tf.Tensor | None = None
    ) -> Any:
        y_pred = tf.cast(y_pred, self.dtype)
        return super().update_state(tf.abs(aligned_targets(y_true, y_pred) - y_pred), sample_weight)


@keras.saving.register_keras_serializable(package="slipway")
class RegressionR2(keras.metrics.R2Score):
    """The coefficient of determination over a split, averaged over the head's values.

    Built for ``units`` values up front, so its accumulators exist before any traced step
    (a strategy's replicas must not create variables inside a step).
    """

    def __init__(self, units: int = 1, name: str = "r2", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.units = units
        self.build((None, units), (None, units))

    def update_state(
        self, y_true: tf.Tensor, y_pred: tf.Tensor, sample_weight: tf.Tensor | None = None
    ) -> Any:
        y_pred = tf.reshape(tf.cast(y_pred, self.dtype), [-1, self.units])
        y_true = aligned_targets(y_true, y_pred)
        if sample_weight is not None:
            sample_weight = tf.reshape(
                tf.cast(sample_weight, self.dtype), [tf.shape(y_pred)[0], -1]
            )
        return super().update_state(y_true, y_pred, sample_weight)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "units": self.units}
