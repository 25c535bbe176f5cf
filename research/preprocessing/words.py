"""Raw text -> a TF-IDF bag of word n-grams in the TensorFlow graph.

On a few thousand texts a linear model over word n-grams weighted by inverse document
frequency is hard to beat (the textbook TF-IDF + linear SVM); a subword sequence model
has too little data to learn what the bag gives it for free. A text field declared with
``words`` in the data spec is read this way: the dataset build learns the terms and
their document frequencies from the training split and writes them beside the shards
(``FeatureSpec.words_file``); :class:`WordBag` turns a text into the bag with them.

``text_terms`` is the one definition of a text's terms. The build counts document
frequencies by running it, and the input pipeline and the served graph run it inside
:class:`WordBag`, so the terms a model is trained on, those it is served, and those the
vocabulary was chosen from are the same by construction.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tensorflow as tf
import tf_keras as keras

from contracts.dataset_manifest import DatasetError
from contracts.features import FeatureSpec
from research.preprocessing.learned_files import read_learned_file

# Anything that is not a letter, a digit or an underscore separates words (RE2 syntax:
# the classes are Unicode-aware, unlike RE2's \w).
_NOT_WORD = r"[^\p{L}\p{N}_]+"
_SEPARATOR = " "


def text_terms(texts: Any, ngrams: int) -> tf.RaggedTensor:
    """Strings ``[batch]`` -> each text's terms: its lower-cased words and the runs of
    2 .. ``ngrams`` consecutive words, joined by a space (``[batch, None]`` strings)."""
    texts = tf.convert_to_tensor(texts, dtype=tf.string)
    lowered = tf.strings.lower(texts, encoding="utf-8")
    words = tf.strings.split(tf.strings.regex_replace(lowered, _NOT_WORD, _SEPARATOR))
    if ngrams == 1:
        return words
    return tf.strings.ngrams(words, ngram_width=list(range(1, ngrams + 1)), separator=_SEPARATOR)


def inverse_document_frequencies(
    document_frequencies: Sequence[int], documents: int
) -> list[float]:
    """Smoothed IDF, ``1 + ln((1 + documents) / (1 + df))``: as if one more document held
    every term, so no weight is infinite or zero (scikit-learn's ``smooth_idf``)."""
    return [1.0 + math.log((1.0 + documents) / (1.0 + df)) for df in document_frequencies]


@keras.utils.register_keras_serializable(package="slipway")
class WordBag(keras.layers.Layer):
    """Strings ``[batch]`` (or ``[batch, 1]``) -> float32 ``[batch, len(terms)]``.

    Each term's weight is ``(1 + ln count) * idf``, the row scaled to unit length
    (sublinear TF-IDF): a word repeated ten times counts for about three, and a long
    text weighs as much as a short one. Terms outside ``terms`` are ignored; a text with
    none of them is all zeros.
    """

    def __init__(
        self, terms: Sequence[str], idf: Sequence[float], ngrams: int, **kwargs: Any
    ) -> None:
        super().__init__(**{**kwargs, "trainable": False})
        if len(terms) != len(idf):
            raise ValueError(f"{len(terms)} terms but {len(idf)} IDF weights")
        if not terms:
            raise ValueError("a word bag needs at least one term")
        if ngrams < 1:
            raise ValueError(f"ngrams must be >= 1, got {ngrams}")
        self.terms = list(terms)
        self.idf = [float(weight) for weight in idf]
        self.ngrams = int(ngrams)
        # Id 0 is every term not in ``terms``; term i has id i + 1.
        self._lookup = keras.layers.StringLookup(
            vocabulary=self.terms, num_oov_indices=1, output_mode="int"
        )
        self._idf = tf.constant([0.0, *self.idf], dtype=tf.float32)

    def call(self, texts: Any) -> tf.Tensor:
        texts = tf.convert_to_tensor(texts, dtype=tf.string)
        if texts.shape.rank == 2:
            texts = tf.squeeze(texts, axis=-1)
        ids = tf.ragged.map_flat_values(self._lookup, text_terms(texts, self.ngrams))
        size = len(self.terms) + 1
        counts = tf.math.bincount(
            ids, minlength=size, maxlength=size, dtype=tf.float32, axis=-1, binary_output=False
        )
        weights = tf.where(counts > 0, 1.0 + tf.math.log(tf.maximum(counts, 1.0)), 0.0)
        return tf.math.l2_normalize(weights * self._idf, axis=-1)[:, 1:]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "terms": self.terms, "idf": self.idf, "ngrams": self.ngrams}


def read_word_bag(dataset_dir: str | Path, feature: FeatureSpec) -> dict[str, Any]:
    """The terms file of text feature ``feature``, checked against the manifest.

    A missing file, one whose SHA-256 differs from the manifest's, or one without terms
    and their document frequencies is a ``DatasetError`` naming the file.
    """
    path, content = read_learned_file(dataset_dir, feature, "words_file", "word terms")
    try:
        bag = json.loads(content)
        terms, frequencies = bag["terms"], bag["document_frequencies"]
        documents, ngrams = int(bag["documents"]), int(bag["ngrams"])
        if len(terms) != len(frequencies) or not terms:
            raise ValueError("terms and document_frequencies differ in length or are empty")
    except (ValueError, KeyError, TypeError) as exc:
        raise DatasetError(
            f"{path}: the word terms of text feature {feature.name!r} are unreadable: {exc}"
        ) from None
    return {
        "terms": terms,
        "idf": inverse_document_frequencies(frequencies, documents),
        "ngrams": ngrams,
    }


def word_bag_for(dataset_dir: str | Path, feature: FeatureSpec) -> WordBag:
    """The layer that reads ``feature`` as the dataset at ``dataset_dir`` describes."""
    return WordBag(**read_word_bag(dataset_dir, feature), name=f"{feature.name}_words")
