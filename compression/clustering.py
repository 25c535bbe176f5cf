"""Weight clustering with tfmot: each kernel keeps only a few distinct values.

Every layer tfmot can cluster shares ``number_of_clusters`` centroids per kernel (k-means++
initialised, then fine-tuned), and the wrappers are stripped so the result is the source
architecture whose kernels hold at most that many values: a file that compresses well
(gzip) and that int8 conversion represents exactly. Layers tfmot cannot cluster (the
zoo's custom embedding) keep their weights and are listed with the reason; normalisation
layers have no kernels to cluster and are left as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow_model_optimization as tfmot
import tf_keras as keras

from compression.convert import to_tflite
from compression.errors import CompressionError
from compression.finetune import (
    DEFAULT_EPOCHS,
    DEFAULT_LEARNING_RATE,
    TrainingData,
    copy_model,
    fine_tune,
    infer_heads,
)
from compression.result import CompressedModel
from research.models import HeadSpec

clustering = tfmot.clustering.keras


def _wrap(
    model: keras.Model, number_of_clusters: int
) -> tuple[keras.Model, dict[str, list[str]], dict[str, str]]:
    """(model with clustering wrappers, {clustered layer: weight attributes}, {left: why})."""
    clustered: dict[str, list[str]] = {}
    skipped: dict[str, str] = {}

    def wrap(layer: keras.layers.Layer) -> keras.layers.Layer:
        if not layer.trainable_weights:
            return layer
        if isinstance(layer, keras.Model):
            skipped[layer.name] = "nested models are not clustered"
            return layer
        try:
            wrapper = clustering.cluster_weights(
                layer,
                number_of_clusters=number_of_clusters,
                cluster_centroids_init=clustering.CentroidInitialization.KMEANS_PLUS_PLUS,
            )
        except ValueError:
            skipped[layer.name] = f"tfmot cannot cluster {type(layer).__name__}"
            return layer
        if wrapper is layer:
            skipped[layer.name] = "too few weights to cluster"
            return layer
        attributes = [name for name, _ in wrapper.layer.get_clusterable_weights()]
        if not attributes:  # normalisation layers: their scales and shifts stay as they are
            return layer
        clustered[layer.name] = attributes
        return wrapper

    wrapped = keras.models.clone_model(model, clone_function=wrap)
    return wrapped, clustered, skipped


def distinct_values(model: keras.Model, weights: Mapping[str, list[str]]) -> dict[str, int]:
    """The largest number of distinct values among each layer's clustered weights.

    ``weights`` maps layer names to weight attributes (``kernel``,
    ``_query_dense.kernel``), as tfmot names the weights it clusters.
    """
    counts = {}
    for name, attributes in weights.items():
        layer = model.get_layer(name)
        counts[name] = max(
            len(np.unique(np.asarray(_attribute(layer, attribute)))) for attribute in attributes
        )
    return counts


def _attribute(layer: keras.layers.Layer, dotted: str) -> Any:
    value: Any = layer
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def cluster(
    model: keras.Model,
    train: TrainingData,
    validation: TrainingData | None = None,
    *,
    heads: Mapping[str, HeadSpec] | None = None,
    number_of_clusters: int = 16,
    epochs: int = DEFAULT_EPOCHS,
    learning_rate: float = DEFAULT_LEARNING_RATE,
    seed: int = 0,
    verbose: int = 0,
) -> CompressedModel:
    """Cluster a copy of ``model``'s weights and fine-tune the centroids on ``train``.

    The Keras result is the stripped model (same names and signature) and its TFLite the
    float conversion. ``details`` has ``clusters``, ``clustered_layers``, the measured
    ``distinct_values`` per clustered layer, ``unclustered_layers`` with reasons, and the
    fine-tuning ``history``.
    """
    if number_of_clusters < 2:
        raise CompressionError(f"number_of_clusters must be >= 2, got {number_of_clusters}")
    heads = dict(heads) if heads is not None else infer_heads(model)
    keras.utils.set_random_seed(seed)
    wrapped, clustered, skipped = _wrap(copy_model(model), number_of_clusters)
    if not clustered:
        raise CompressionError(f"{model.name}: no layer can be clustered ({skipped})")
    history = fine_tune(
        wrapped,
        train,
        heads,
        epochs=epochs,
        learning_rate=learning_rate,
        seed=seed,
        validation=validation,
        verbose=verbose,
    )
    stripped = clustering.strip_clustering(wrapped)
    details: dict[str, Any] = {
        "clusters": number_of_clusters,
        "clustered_layers": list(clustered),
        "distinct_values": distinct_values(stripped, clustered),
        "unclustered_layers": skipped,
        "history": history,
    }
    return CompressedModel("cluster", to_tflite(stripped), stripped, details)
