"""The feature contract between the dataset writer and every reader.

A feature's spec lives in ``manifest.json`` under ``features``; this module turns a
record into a ``tf.train.Example`` and a spec into the matching parsing spec, so the
two sides of the file format are written down exactly once.

Encoding, per feature type:
- numeric: ``float_list`` (float32) or ``int64_list`` (int64), ``shape`` values, as
  the source holds them. A feature may declare how a model reads it (``clip`` to bounds,
  then a ``log`` transform for heavy tails): that happens in the model's graph, and the
  build records the statistics of the values as the model reads them.
- categorical: ``bytes_list`` with the UTF-8 value; readers map it to an id with the
  manifest's ``vocabulary`` (out-of-vocabulary values get id ``len(vocabulary)``).
- text: ``bytes_list`` with the UTF-8 text. Readers turn it into token ids with the
  sentencepiece model the spec names (``tokenizer_file``), in the graph, so a served
  model tokenizes exactly as training did; or, for a feature with a ``words_file``,
  into a TF-IDF bag of the word n-grams that file lists.
- image: ``bytes_list`` with a PNG of exactly ``height`` x ``width`` x ``channels``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from contracts.example_encoding import (
    bytes_feature,
    float_feature,
    int64_feature,
    serialize_example,
)


@dataclass(frozen=True)
class FeatureSpec:
    """One feature as recorded in the manifest."""

    name: str
    type: str  # numeric | categorical | text | image
    dtype: str = "float32"  # numeric only: float32 | int64
    shape: tuple[int, ...] = ()
    height: int | None = None
    width: int | None = None
    channels: int | None = None
    vocabulary: tuple[str, ...] = ()  # categorical: ids are positions in this list
    tokenizer_file: str | None = None  # text: the sentencepiece model, dataset-relative
    tokenizer_sha256: str | None = None  # text: of tokenizer_file, checked before it is used
    vocab_size: int | None = None  # text: number of token ids (ids are 0..vocab_size-1)
    words_file: str | None = None  # text read as a bag of words: its terms, dataset-relative
    words_sha256: str | None = None  # of words_file, checked before it is used
    words_size: int | None = None  # number of terms in words_file: the bag's width
    is_label: bool = False
    source_name: str | None = None  # the source column, when named otherwise (`mean radius`)
    clip: tuple[float, float] | None = None  # numeric: bounds a model clips values to
    transform: str | None = None  # numeric: "log", sign(x) * log(1 + |x|), after clip
    normalization: str | None = None  # text, categorical: Unicode form the build stored
    collapse_whitespace: bool | None = None  # text, categorical: the build collapsed runs
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_values(self) -> int:
        return math.prod(self.shape) if self.shape else 1

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("name")
        data["shape"] = list(self.shape)
        data["vocabulary"] = list(self.vocabulary)
        data["clip"] = list(self.clip) if self.clip else None
        return {key: value for key, value in data.items() if value not in (None, [], {})}

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> FeatureSpec:
        return cls(
            name=name,
            type=data["type"],
            dtype=data.get("dtype", "float32"),
            shape=tuple(data.get("shape", ())),
            height=data.get("height"),
            width=data.get("width"),
            channels=data.get("channels"),
            vocabulary=tuple(data.get("vocabulary", ())),
            tokenizer_file=data.get("tokenizer_file"),
            tokenizer_sha256=data.get("tokenizer_sha256"),
            vocab_size=data.get("vocab_size"),
            words_file=data.get("words_file"),
            words_sha256=data.get("words_sha256"),
            words_size=data.get("words_size"),
            is_label=bool(data.get("is_label", False)),
            source_name=data.get("source_name"),
            clip=tuple(data["clip"]) if data.get("clip") else None,
            transform=data.get("transform"),
            normalization=data.get("normalization"),
            collapse_whitespace=data.get("collapse_whitespace"),
            extra=dict(data.get("extra", {})),
        )

    @property
    def reads_words(self) -> bool:
        """Whether a model reads this text feature as a TF-IDF bag of word n-grams
        (``research.preprocessing.words``) rather than as subword ids."""
        return self.words_file is not None

    @property
    def reshaped(self) -> bool:
        """Whether a model reads this numeric feature otherwise than as stored."""
        return self.clip is not None or self.transform is not None

    def as_model_reads(self, value: float) -> float:
        """One value as a model reads it: clipped, then transformed. The statistics a
        model standardizes with are of these values; ``research.preprocessing.numeric``
        does the same in the graph."""
        if self.clip is not None:
            value = min(max(value, self.clip[0]), self.clip[1])
        if self.transform == "log":
            value = math.copysign(math.log1p(abs(value)), value)
        return value

    def value_read_as(self, read: float) -> float:
        """A value the model reads as ``read`` (the inverse of ``as_model_reads`` over
        the clipped range, where a mean of values as read always lies)."""
        if self.transform == "log":
            return math.copysign(math.expm1(abs(read)), read)
        return read


def features_from_json(data: Mapping[str, Mapping[str, Any]]) -> dict[str, FeatureSpec]:
    return {name: FeatureSpec.from_json(name, spec) for name, spec in data.items()}


def features_to_json(features: Mapping[str, FeatureSpec]) -> dict[str, dict[str, Any]]:
    return {name: spec.to_json() for name, spec in features.items()}


_PLAIN_NUMBER_TYPES = frozenset({int, float})


def plain_numbers(values: list[Any] | tuple[Any, ...]) -> bool:
    """Whether every value is a Python ``int`` or ``float`` (not a bool, a string or None).

    Such a list takes the fast paths of conformance, statistics and encoding, which read it
    with the C-level builtins (``min``, ``max``, ``map``, ``array``) instead of one value at
    a time: a 64-value vector per record is most of a numeric dataset's build otherwise.
    """
    return bool(values) and set(map(type, values)) <= _PLAIN_NUMBER_TYPES


def _flat(value: Any) -> list[Any]:
    if value is None:
        return []
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list | tuple):
        if plain_numbers(value):
            return list(value)  # flat already: a numeric vector
        out: list[Any] = []
        for item in value:
            out.extend(_flat(item))
        return out
    return [value]


def encode_example(record: Mapping[str, Any], features: Mapping[str, FeatureSpec]) -> bytes:
    """Serialise one clean record as a ``tf.train.Example`` following the contract above.

    A field missing from the record is left out of the Example; readers fill in the
    documented default (0, empty string). The bytes are written without
    TensorFlow (``contracts.example_encoding``), so a build's workers never load it.
    """
    encoded: dict[str, bytes] = {}
    for name, spec in features.items():
        value = record.get(name)
        if value is None:
            continue
        if spec.type == "numeric":
            values = _flat(value)
            if spec.dtype == "int64":
                encoded[name] = int64_feature(int(v) for v in values)
            elif plain_numbers(values):
                encoded[name] = float_feature(values)  # array.array reads them as float()
            else:
                encoded[name] = float_feature(float(v) for v in values)
        elif spec.type == "image":
            encoded[name] = bytes_feature([bytes(value)])
        else:
            text = value if isinstance(value, str) else str(value)
            encoded[name] = bytes_feature([text.encode("utf-8")])
    return serialize_example(encoded)


def parsing_spec(
    features: Mapping[str, FeatureSpec], missing: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """The ``tf.io.parse_example`` spec that reads what ``encode_example`` wrote.

    ``missing``: what a numeric feature absent from an Example reads as, by name (0
    otherwise); an int64 feature reads the nearest integer.
    """
    import tensorflow as tf

    spec: dict[str, Any] = {}
    for name, feature in features.items():
        if feature.type == "numeric":
            dtype = tf.int64 if feature.dtype == "int64" else tf.float32
            fill = (missing or {}).get(name, 0.0)
            value = round(fill) if dtype == tf.int64 else float(fill)
            default = [value] * feature.num_values if feature.shape else value
            spec[name] = tf.io.FixedLenFeature(list(feature.shape), dtype, default_value=default)
        elif feature.type in ("categorical", "image", "text"):
            spec[name] = tf.io.FixedLenFeature([], tf.string, default_value="")
        else:
            raise ValueError(f"feature {name!r}: unknown type {feature.type!r}")
    return spec
