"""Text and category strings cleaned in the graph exactly as the dataset build cleaned them.

The build stores values in one Unicode form with whitespace runs collapsed
(``research.data.clean``), and the tokenizer and vocabularies are learned from those
values. A client sends what it has: a full-width "ＦＲ", a category with a trailing
space, a text with non-breaking spaces. Cleaned here first, in the serving graph and in
the input pipeline alike (where stored values pass through unchanged), they reach the
lookup and the tokenizer as the training data did.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tensorflow_text as tf_text
import tf_keras as keras

from contracts.features import FeatureSpec

# Python's ``str.split()`` (what the build collapses with) splits on ``str.isspace``
# characters; RE2's ``\s`` covers only ASCII ones, so the rest are named.
_WHITESPACE_RUN = r"[\t-\r\x{1c}-\x{1f} \x{85}\p{Z}]+"


@keras.utils.register_keras_serializable(package="slipway")
class StringCleaner(keras.layers.Layer):
    """Strings -> the same strings in Unicode form ``normalization`` (NFC, NFKC, or
    None to keep them), with whitespace runs made one space and the ends stripped when
    ``collapse_whitespace``."""

    def __init__(self, normalization: str | None, collapse_whitespace: bool, **kwargs: Any) -> None:
        super().__init__(**{**kwargs, "trainable": False})
        if normalization not in (None, "NFC", "NFKC"):
            raise ValueError(f"unknown Unicode normalization {normalization!r}")
        self.normalization = normalization
        self.collapse_whitespace = bool(collapse_whitespace)

    def call(self, texts: Any) -> tf.Tensor:
        texts = tf.convert_to_tensor(texts, dtype=tf.string)
        if self.normalization is not None:
            texts = tf_text.normalize_utf8(texts, self.normalization)
        if self.collapse_whitespace:
            texts = tf.strings.regex_replace(texts, _WHITESPACE_RUN, " ")
            texts = tf.strings.regex_replace(texts, "^ | $", "")
        return texts

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "normalization": self.normalization,
            "collapse_whitespace": self.collapse_whitespace,
        }


def string_cleaner(feature: FeatureSpec) -> StringCleaner | None:
    """The cleaning the build applied to ``feature``'s values, or None when it applied
    none (or the dataset predates recording it)."""
    if feature.normalization is None and not feature.collapse_whitespace:
        return None
    return StringCleaner(
        feature.normalization,
        bool(feature.collapse_whitespace),
        name=f"{feature.name}_cleaned",
    )
