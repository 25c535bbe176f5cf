"""Numeric features standardized with the statistics the dataset build recorded.

Raw measurements span orders of magnitude (0.001 next to 4254 in one table), and a
model that concatenates them unscaled learns slowly and quantizes badly: one int8 scale
cannot cover both. The manifest already holds each feature's mean and standard
deviation over the training split, so the scaling is fixed at build time, identical in
training and serving, and needs no pass over the data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tensorflow as tf
import tf_keras as keras

from contracts.features import FeatureSpec


@keras.utils.register_keras_serializable(package="slipway")
class Standardize(keras.layers.Layer):
    """``(x - mean) / std`` in float32, keeping the input's shape; NaN, a value the
    client does not have, reads as the mean (0), as a cell missing from a training
    record does (``research.data.input_pipeline``), rather than poisoning the output.

    Keras' ``Normalization`` with one mean for the whole feature adds an axis to a
    batch of scalars; a feature here may be a scalar or a vector, and its shape must
    reach the model unchanged.
    """

    def __init__(self, mean: float, std: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mean = float(mean)
        self.std = float(std)

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        values = tf.cast(inputs, tf.float32)
        standardized = (values - self.mean) * (1.0 / self.std)
        # ``x == x`` is false only for NaN, and unlike ``is_nan`` TFLite has it built in.
        return tf.where(tf.equal(values, values), standardized, tf.zeros_like(standardized))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "mean": self.mean, "std": self.std}


def standardizer(feature: FeatureSpec, statistics: Mapping[str, Any] | None) -> Standardize:
    """The feature's standardization with its recorded statistics.

    A feature without statistics, or with a constant value (std 0), is only centred:
    dividing by a zero deviation would turn any other value into an overflow.
    """
    stats = statistics or {}
    mean, std = stats.get("mean"), stats.get("std")
    return Standardize(
        mean=float(mean) if mean is not None else 0.0,
        std=float(std) if std else 1.0,
        name=f"{feature.name}_standardized",
    )
