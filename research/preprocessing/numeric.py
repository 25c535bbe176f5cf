"""Numeric features standardized with the statistics the dataset build recorded.

Raw measurements span orders of magnitude (0.001 next to 4254 in one table), and a
model that concatenates them unscaled learns slowly and quantizes badly: one int8 scale
cannot cover both. The manifest already holds each feature's mean and standard
deviation over the training split, so the scaling is fixed at build time, identical in
training and serving, and needs no pass over the data. A feature the data spec clips or
log-transforms is standardized with the statistics of its values as read that way.
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

    A feature with a heavy tail or outliers may be read clipped to ``clip`` and then
    through ``transform`` (``log``: ``sign(x) * log(1 + |x|)``), the way
    ``FeatureSpec.as_model_reads`` defines for the build's statistics: one income of
    10 million would otherwise squeeze every other value into a sliver of the range.

    Keras' ``Normalization`` with one mean for the whole feature adds an axis to a
    batch of scalars; a feature here may be a scalar or a vector, and its shape must
    reach the model unchanged.
    """

    def __init__(
        self,
        mean: float,
        std: float,
        clip: tuple[float, float] | None = None,
        transform: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if transform not in (None, "log"):
            raise ValueError(f"unknown transform {transform!r}; the one there is: log")
        self.mean = float(mean)
        self.std = float(std)
        self.clip = (float(clip[0]), float(clip[1])) if clip is not None else None
        self.transform = transform

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        values = tf.cast(inputs, tf.float32)
        read = values
        if self.clip is not None:
            read = tf.clip_by_value(read, self.clip[0], self.clip[1])
        if self.transform == "log":
            # log(1 + |x|) rather than log1p: TFLite has LOG, ABS and SIGN built in.
            read = tf.sign(read) * tf.math.log(1.0 + tf.abs(read))
        standardized = (read - self.mean) * (1.0 / self.std)
        # ``x == x`` is false only for NaN, and unlike ``is_nan`` TFLite has it built in.
        return tf.where(tf.equal(values, values), standardized, tf.zeros_like(standardized))

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "mean": self.mean,
            "std": self.std,
            "clip": list(self.clip) if self.clip is not None else None,
            "transform": self.transform,
        }


def standardizer(feature: FeatureSpec, statistics: Mapping[str, Any] | None) -> Standardize:
    """The feature's standardization with its recorded statistics: of the values as the
    model reads them, for a feature it reads clipped or transformed.

    A feature without statistics, or with a constant value (std 0), is only centred:
    dividing by a zero deviation would turn any other value into an overflow.
    """
    stats = statistics or {}
    if feature.reshaped:
        stats = stats.get("as_read") or {}
    mean, std = stats.get("mean"), stats.get("std")
    return Standardize(
        mean=float(mean) if mean is not None else 0.0,
        std=float(std) if std else 1.0,
        clip=feature.clip,
        transform=feature.transform,
        name=f"{feature.name}_standardized",
    )
