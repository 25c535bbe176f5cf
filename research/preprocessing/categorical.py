"""Categorical strings mapped to ids with the manifest's vocabulary.

``StringLookup`` keeps one out-of-vocabulary id, 0, for values the training split never
held (and for a missing value, the empty string); the vocabulary's entries follow from
id 1, so a model's embedding has ``len(vocabulary) + 1`` rows.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from contracts.features import FeatureSpec

OOV_ID = 0


def _oov_token(vocabulary: tuple[str, ...]) -> str:
    """A name for the out-of-vocabulary id that is no real category.

    ``StringLookup`` refuses a vocabulary holding its OOV token, and a dataset may
    have a category literally called ``[UNK]``.
    """
    token = "[UNK]"
    taken = set(vocabulary)
    while token in taken:
        token = f"[{token}]"
    return token


@keras.utils.register_keras_serializable(package="slipway")
class NoCategories(keras.layers.Layer):
    """The lookup of a feature whose training split held no value: every id is OOV.

    ``StringLookup`` cannot be built on an empty vocabulary.
    """

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        return tf.fill(tf.shape(inputs), tf.constant(OOV_ID, tf.int64))


def category_lookup(feature: FeatureSpec) -> keras.layers.Layer:
    """The feature's string -> int64 id lookup (out-of-vocabulary -> ``OOV_ID``)."""
    if not feature.vocabulary:
        return NoCategories(name=f"{feature.name}_lookup")
    return keras.layers.StringLookup(
        vocabulary=list(feature.vocabulary),
        num_oov_indices=1,
        mask_token=None,
        oov_token=_oov_token(feature.vocabulary),
        output_mode="int",
        name=f"{feature.name}_lookup",
    )
