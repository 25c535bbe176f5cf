"""Short, seeded fine-tuning shared by the methods that retrain (pruning, QAT, clustering).

A compression method only recovers accuracy if it trains on what the model was trained
on, with the losses its heads need. The heads are derived from the model's outputs and
the source version's ``slipway.json`` labels, the batches come from the dataset's input
pipeline keyed by the model's own input and output names, and every run is seeded, so
the same source model, data and seed give the same compressed weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorflow as tf
import tf_keras as keras

from compression.errors import CompressionError
from compression.loading import named_inputs, output_names
from contracts.dataset_manifest import DatasetError, Manifest, load_manifest
from research.data.input_pipeline import make_dataset, verify_shards
from research.experiments.model_io import ModelIO
from research.experiments.task import as_head_labels
from research.models import HeadSpec, input_spec_from_feature
from research.models.endpoints import compile_args

DEFAULT_EPOCHS = 2
DEFAULT_LEARNING_RATE = 1e-3
DEFAULT_BATCH_SIZE = 32


@dataclass(frozen=True)
class TrainingData:
    """A split read as endless ``(features, labels)`` batches keyed by the model's names.

    A recipe rather than a ``tf.data.Dataset``: a dataset reshuffles differently on
    every pass, so each fine-tuning run makes a fresh one from its own seed and two runs
    with one seed see the same batches in the same order. ``steps`` (full batches in
    one pass over the split) is what ``fit`` counts as an epoch, and is known up front
    because pruning schedules are counted in optimizer steps.
    """

    dataset_dir: Path
    split: str
    batch_size: int
    steps: int
    io: ModelIO
    sequence_length: int | None = None
    shuffle: bool | None = None

    def dataset(self, seed: int = 0) -> tf.data.Dataset:
        """The stream for one run. It repeats because Keras keeps one iterator across
        epochs when given ``steps_per_epoch``; shards were verified when this was made."""
        batches = make_dataset(
            self.dataset_dir,
            self.split,
            batch_size=self.batch_size,
            shuffle=self.shuffle,
            seed=seed,
            features=list(self.io.inputs),
            sequence_length=self.sequence_length,
            repeat=True,
            drop_remainder=True,
            verify="size",
        )
        return batches.map(as_head_labels(self.io))


# -- heads ----------------------------------------------------------------------------


def _output_tensor(model: keras.Model, name: str) -> Any:
    if isinstance(model.output, Mapping):
        return model.output[name]
    return dict(zip(model.output_names, tf.nest.flatten(model.output), strict=True))[name]


def _ends_in_softmax(tensor: Any) -> bool:
    layer = tensor._keras_history.layer
    return isinstance(layer, keras.layers.Softmax) or (
        getattr(layer, "activation", None) is keras.activations.softmax
    )


def infer_heads(
    model: keras.Model, labels: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, HeadSpec]:
    """A head per model output, so fine-tuning uses the loss the model was trained with.

    ``labels`` is ``slipway.json``'s ``labels`` section: its ``kind`` wins; without one, an
    output with label ``classes`` or a softmax at its end is a classification, anything
    else a regression over the output's width.
    """
    heads = {}
    for name in output_names(model):
        described = (labels or {}).get(name) or {}
        tensor = _output_tensor(model, name)
        kind = described.get("kind")
        if kind is None:
            softmax = "classes" in described or _ends_in_softmax(tensor)
            kind = "classification" if softmax else "regression"
        width = tensor.shape[-1]
        if kind == "classification":
            heads[name] = HeadSpec(kind=kind, num_classes=width)
        elif kind == "regression":
            heads[name] = HeadSpec(kind=kind, units=width)
        elif kind == "language_model":
            heads[name] = HeadSpec(kind=kind)
        else:
            raise CompressionError(f"output {name!r}: unknown head kind {kind!r} in slipway.json")
    return heads


# -- data -----------------------------------------------------------------------------


def open_dataset(dataset_dir: str | Path, split: str) -> Manifest:
    """The dataset's manifest, refusing a directory or split that is not there."""
    try:
        manifest = load_manifest(dataset_dir)
    except DatasetError as exc:
        raise CompressionError(f"dataset: {exc}") from None
    if split not in manifest.splits:
        raise CompressionError(
            f"{dataset_dir}: the dataset has no split {split!r} (it has {sorted(manifest.splits)})"
        )
    return manifest


def check_inputs(manifest: Manifest, inputs: Mapping[str, Any], dataset_dir: str | Path) -> None:
    """Every model input must be an input feature of the dataset, with the same size.

    ``inputs`` maps names to anything with a ``shape`` (Keras tensors or TensorSpecs),
    batch dimension first. Text lengths are the pipeline's choice and not compared.
    """
    labels = set(manifest.labels) | {n for n, f in manifest.features.items() if f.is_label}
    available = [name for name in manifest.features if name not in labels]
    missing = [name for name in inputs if name not in available]
    if missing:
        raise CompressionError(
            f"{dataset_dir}: the model reads {missing}, which the dataset does not have as "
            f"input features (it has {available})"
        )
    for name, tensor in inputs.items():
        expected = _feature_shape(manifest.features[name])
        shape = tuple(tf.TensorShape(tensor.shape).as_list()[1:])
        # A scalar feature may feed a (1,)-shaped input: unit dimensions are not compared.
        if expected is not None and None not in shape and _sizes(shape) != _sizes(expected):
            raise CompressionError(
                f"{dataset_dir}: input {name!r} has shape {list(shape)} in the model but "
                f"{list(expected)} in the dataset"
            )


def _sizes(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(size for size in shape if size != 1)


def _feature_shape(feature: Any) -> tuple[int, ...] | None:
    if feature.type == "numeric":
        return tuple(feature.shape)
    if feature.type == "image":
        return (feature.height, feature.width, feature.channels or 1)
    if feature.type == "categorical":
        return ()
    return None  # text: the length is the pipeline's choice


def sequence_length(inputs: Mapping[str, Any]) -> int | None:
    """The fixed length of the model's token inputs, so the pipeline pads to it."""
    lengths = {
        tf.TensorShape(tensor.shape)[1]
        for tensor in inputs.values()
        if tf.as_dtype(tensor.dtype).is_integer and tf.TensorShape(tensor.shape).rank == 2
    }
    lengths.discard(None)
    if len(lengths) > 1:
        raise CompressionError(f"token inputs of different fixed lengths {sorted(lengths)}")
    return lengths.pop() if lengths else None


def _check_labels(
    heads: Mapping[str, HeadSpec], manifest: Manifest, dataset_dir: str | Path
) -> None:
    if any(head.kind == "language_model" for head in heads.values()):
        return  # trained on next-token pairs of its own input
    missing = [name for name in heads if name not in manifest.labels]
    if missing:
        raise CompressionError(
            f"{dataset_dir}: the model predicts {missing}, which are not labels of the dataset "
            f"(labels: {list(manifest.labels)})"
        )


def training_data(
    dataset_dir: str | Path,
    model: keras.Model,
    heads: Mapping[str, HeadSpec],
    *,
    split: str = "train",
    batch_size: int = DEFAULT_BATCH_SIZE,
    shuffle: bool | None = None,
) -> TrainingData:
    """Batches of one split shaped for ``model.fit``: inputs and labels by model name.

    Checks now, before any training, that the dataset has the model's inputs (with
    matching sizes) and labels, and that its shards match the manifest. A language-model
    head trains on next-token pairs of its single token input, as the trainer does.
    Fewer records than one batch is an error: nothing would be trained.
    """
    manifest = open_dataset(dataset_dir, split)
    inputs = named_inputs(model)
    check_inputs(manifest, inputs, dataset_dir)
    _check_labels(heads, manifest, dataset_dir)
    steps = manifest.splits[split].num_records // batch_size
    if steps < 1:
        raise CompressionError(
            f"{dataset_dir}: split {split!r} has {manifest.splits[split].num_records} records, "
            f"fewer than one batch of {batch_size}"
        )
    try:
        verify_shards(dataset_dir, manifest, split)
    except DatasetError as exc:
        raise CompressionError(f"dataset: {exc}") from None
    length = sequence_length(inputs)
    specs = {
        name: input_spec_from_feature(manifest.features[name], sequence_length=length)
        for name in inputs
    }
    return TrainingData(
        dataset_dir=Path(dataset_dir),
        split=split,
        batch_size=batch_size,
        steps=steps,
        io=ModelIO(specs, dict(heads)),
        sequence_length=length,
        shuffle=shuffle,
    )


# -- training -------------------------------------------------------------------------


def copy_model(model: keras.Model) -> keras.Model:
    """An independent copy with the same weights.

    tfmot's wrappers reuse the layers they wrap, so training a wrapped model would change
    the source model in place; methods work on a copy and leave the reference intact.
    """
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def fine_tune(
    model: keras.Model,
    train: TrainingData,
    heads: Mapping[str, HeadSpec],
    *,
    epochs: int = DEFAULT_EPOCHS,
    learning_rate: float = DEFAULT_LEARNING_RATE,
    seed: int = 0,
    callbacks: Iterable[keras.callbacks.Callback] = (),
    validation: TrainingData | None = None,
    verbose: int = 0,
) -> dict[str, list[float]]:
    """Compile ``model`` for its heads and train it; the per-epoch history.

    ``seed`` drives the batch order and every random op (dropout, initialisers), so a
    run repeats exactly.
    """
    if epochs < 1:
        raise CompressionError(f"epochs must be >= 1, got {epochs}")
    keras.utils.set_random_seed(seed)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), **compile_args(heads))
    history = model.fit(
        train.dataset(seed),
        epochs=epochs,
        steps_per_epoch=train.steps,
        validation_data=None if validation is None else validation.dataset(seed),
        validation_steps=None if validation is None else validation.steps,
        callbacks=list(callbacks),
        verbose=verbose,
    )
    return {key: [float(value) for value in values] for key, values in history.history.items()}
