"""Raw text -> token ids in the TensorFlow graph, with a dataset's sentencepiece model.

The dataset build learns one sentencepiece model per text field and writes it beside
the shards (``FeatureSpec.tokenizer_file``). :class:`SubwordTokenizer` runs that model
as TensorFlow ops, so the ``tf.data`` input pipeline and an exported serving function
that takes raw strings compute the same ids from the same layer.

Importing this module imports ``tensorflow_text``, which registers the tokenizer's
custom ops with TensorFlow. A program that *loads* a SavedModel holding this layer
without importing this module must import ``tensorflow_text`` itself before
``tf.saved_model.load`` (the serving gateway's SavedModel backend does), or the load
fails on an unknown op.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import tensorflow as tf
import tensorflow_text as tf_text
import tf_keras as keras

from contracts.dataset_manifest import DatasetError
from contracts.features import FeatureSpec
from research.preprocessing.learned_files import read_learned_file

PAD_ID = 0

# sentencepiece's ModelProto: field 2 is the TrainerSpec.
_TRAINER_SPEC_FIELD = 2


class SubwordTokenizer(keras.layers.Layer):
    """Strings ``[batch]`` (or ``[batch, 1]``) -> ``int32`` ids ``[batch, sequence_length]``.

    Ids are padded with ``PAD_ID`` and truncated to ``sequence_length``; with ``None``
    each batch is padded to its longest text. Every model runs on tensorflow_text's
    ``FastSentencepieceTokenizer``: its model is a constant of the graph, so the layer
    holds no resource that a tf.data pipeline, a second trainer in the same process or
    ``clear_session`` could lose, and TFLite runs it too. It segments a unigram model
    exactly as sentencepiece does; for a BPE model its segmentation differs from the
    sentencepiece library's on a few texts (18 of 505 varied strings when measured).
    Training and serving run this same layer, so they always agree with each other.
    """

    def __init__(self, model: bytes, sequence_length: int | None = None, **kwargs: Any) -> None:
        super().__init__(**{**kwargs, "trainable": False})
        if sequence_length is not None and sequence_length < 1:
            raise ValueError(f"sequence_length must be >= 1, got {sequence_length}")
        self.model = bytes(model)
        self.sequence_length = sequence_length
        self._tokenizer = tf_text.FastSentencepieceTokenizer(self.model)

    def call(self, texts: Any) -> tf.Tensor:
        texts = tf.convert_to_tensor(texts, dtype=tf.string)
        if texts.shape.rank == 2:
            texts = tf.squeeze(texts, axis=-1)
        ids = tf.cast(self._tokenizer.tokenize(texts), tf.int32)
        return ids.to_tensor(default_value=PAD_ID, shape=[None, self.sequence_length])

    def get_config(self) -> dict[str, Any]:
        # The model travels as base64 so that the config stays JSON.
        model = base64.b64encode(self.model).decode("ascii")
        return {**super().get_config(), "model": model, "sequence_length": self.sequence_length}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SubwordTokenizer:
        config = dict(config)
        config["model"] = base64.b64decode(config["model"])
        return cls(**config)


def check_sentencepiece_model(model: bytes) -> None:
    """Refuse bytes that are not a serialized sentencepiece model (``ValueError``), before
    a tokenizer kernel meets them.

    Read from the protobuf wire format directly: sentencepiece's generated Python module
    needs a newer protobuf runtime than TensorFlow allows.
    """
    if not isinstance(_field(model, _TRAINER_SPEC_FIELD), bytes):
        raise ValueError("not a sentencepiece model: it has no trainer spec")


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if position >= len(data):
            raise ValueError("not a protobuf: a truncated varint")
        byte = data[position]
        value |= (byte & 0x7F) << shift
        position += 1
        if not byte & 0x80:
            return value, position
        shift += 7


def _field(message: bytes, number: int) -> int | bytes | None:
    """The last value of field ``number`` (a varint or length-delimited one) in ``message``."""
    found: int | bytes | None = None
    position = 0
    while position < len(message):
        key, position = _varint(message, position)
        wire_type = key & 7
        if wire_type == 0:
            value, position = _varint(message, position)
        elif wire_type == 2:
            length, position = _varint(message, position)
            value, position = message[position : position + length], position + length
        elif wire_type in (1, 5):
            value, position = None, position + (8 if wire_type == 1 else 4)
        else:
            raise ValueError(f"not a protobuf: wire type {wire_type}")
        if position > len(message):
            raise ValueError("not a protobuf: a truncated field")
        if key >> 3 == number:
            found = value
    return found


def read_tokenizer_model(dataset_dir: str | Path, feature: FeatureSpec) -> bytes:
    """The sentencepiece model of text feature ``feature``, checked against the manifest.

    A missing file, one whose SHA-256 differs from the manifest's, or one that is not a
    sentencepiece model is a ``DatasetError`` naming the file.
    """
    path, model = read_learned_file(dataset_dir, feature, "tokenizer_file", "tokenizer")
    try:
        check_sentencepiece_model(model)
    except ValueError as exc:
        raise DatasetError(
            f"{path}: the tokenizer of text feature {feature.name!r}: {exc}"
        ) from None
    return model


def tokenizer_for(
    dataset_dir: str | Path, feature: FeatureSpec, sequence_length: int | None = None
) -> SubwordTokenizer:
    """The layer that tokenizes ``feature`` as the dataset at ``dataset_dir`` does."""
    return SubwordTokenizer(
        read_tokenizer_model(dataset_dir, feature),
        sequence_length,
        name=f"{feature.name}_tokenizer",
    )
