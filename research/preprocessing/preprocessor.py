"""Raw features -> the inputs a model's core reads, built from a dataset manifest.

One ``FeaturePreprocessor`` per reader: the input pipeline calls it on each parsed batch,
and the exported serving graph calls it on what clients send, so both run the same ops
with the same constants (statistics, vocabularies) taken from the same manifest.

Raw form, per feature type (what a client sends under the feature's dataset name):
- numeric: float32 values of the feature's shape -> standardized float32;
- categorical: the category string -> int64 id (0 for a value never seen in training);
- text: the text -> int32 token ids of the dataset's sentencepiece model, padded, or,
  for a field read as words, the float32 TF-IDF bag of its word n-grams; category and
  text strings are cleaned first as the build cleaned them (Unicode form, whitespace);
- image: the encoded file (PNG, JPEG, ...) -> float32 pixels in [0, 1].
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf
import tf_keras as keras

from contracts.dataset_manifest import Manifest
from contracts.features import FeatureSpec
from research.preprocessing.categorical import category_lookup
from research.preprocessing.image import ImageDecoder, image_decoder
from research.preprocessing.numeric import standardizer
from research.preprocessing.strings import StringCleaner, string_cleaner
from research.preprocessing.text import tokenizer_for
from research.preprocessing.words import word_bag_for


def raw_spec(feature: FeatureSpec) -> tf.TensorSpec:
    """What a client sends for ``feature``, batched."""
    if feature.type == "numeric":
        return tf.TensorSpec([None, *feature.shape], tf.float32, name=feature.name)
    return tf.TensorSpec([None], tf.string, name=feature.name)


@dataclass(frozen=True)
class DatasetContext:
    """What a feature's preprocessing is built from besides its spec: the manifest
    (statistics), the dataset directory (tokenizer files) and the token sequence length
    of each text input (``None``: each batch padded to its longest)."""

    manifest: Manifest
    directory: Path
    sequence_lengths: Mapping[str, int | None]


Builder = Callable[[FeatureSpec, DatasetContext], keras.layers.Layer]

_BUILDERS: dict[str, Builder] = {
    "numeric": lambda feature, context: standardizer(
        feature, context.manifest.feature_statistics(feature.name)
    ),
    "categorical": lambda feature, context: category_lookup(feature),
    "text": lambda feature, context: (
        word_bag_for(context.directory, feature)
        if feature.reads_words
        else tokenizer_for(context.directory, feature, context.sequence_lengths.get(feature.name))
    ),
    "image": lambda feature, context: image_decoder(feature),
}


class FeaturePreprocessor(tf.Module):
    """The preprocessing of a model's input features, one layer per feature.

    A ``tf.Module``, so that a SavedModel holding it keeps its lookup tables and
    constants, and a ``tf.data`` map or a serving function can call it.
    """

    def __init__(
        self,
        layers: Mapping[str, keras.layers.Layer],
        specs: Mapping[str, tf.TensorSpec],
        cleaners: Mapping[str, StringCleaner] | None = None,
    ):
        super().__init__(name="preprocessing")
        self.layers = dict(layers)
        self.cleaners = dict(cleaners or {})  # string features: applied before their layer
        self._specs = dict(specs)

    @classmethod
    def from_manifest(
        cls,
        manifest: Manifest,
        features: Mapping[str, FeatureSpec],
        *,
        dataset_dir: str | Path,
        sequence_lengths: Mapping[str, int | None] | None = None,
    ) -> FeaturePreprocessor:
        context = DatasetContext(manifest, Path(dataset_dir), dict(sequence_lengths or {}))
        layers, specs, cleaners = {}, {}, {}
        for name, feature in features.items():
            build = _BUILDERS.get(feature.type)
            if build is None:
                raise ValueError(f"feature {name!r}: unknown type {feature.type!r}")
            layers[name] = build(feature, context)
            specs[name] = raw_spec(feature)
            if cleaner := string_cleaner(feature):  # None where the build cleaned nothing
                cleaners[name] = cleaner
        return cls(layers, specs, cleaners)

    @classmethod
    def for_inputs(
        cls,
        manifest: Manifest,
        names: Iterable[str],
        *,
        dataset_dir: str | Path,
        sequence_lengths: Mapping[str, int | None] | None = None,
    ) -> FeaturePreprocessor:
        """The preprocessing of the model inputs ``names`` that are dataset features (a
        model input the dataset does not describe is passed through as it is)."""
        features = {name: manifest.features[name] for name in names if name in manifest.features}
        return cls.from_manifest(
            manifest, features, dataset_dir=dataset_dir, sequence_lengths=sequence_lengths
        )

    @property
    def image_inputs(self) -> list[str]:
        """The features it decodes from image files."""
        return [name for name, layer in self.layers.items() if isinstance(layer, ImageDecoder)]

    @property
    def raw_specs(self) -> dict[str, tf.TensorSpec]:
        """Feature name -> the batched raw tensor a client sends."""
        return dict(self._specs)

    def __call__(self, raw: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """The preprocessed form of each raw feature given (a caller may send some of
        them as they are, an image's pixels for one)."""
        unknown = sorted(set(raw) - set(self.layers))
        if unknown:
            raise ValueError(f"no preprocessing for {unknown}; it has {sorted(self.layers)}")
        return {name: self.layers[name](self._cleaned(name, value)) for name, value in raw.items()}

    def _cleaned(self, name: str, value: tf.Tensor) -> tf.Tensor:
        cleaner = self.cleaners.get(name)
        return value if cleaner is None else cleaner(value)
