"""What the trainer feeds the model: the experiment's view of a dataset.

Turns a dataset manifest into the model's named inputs and heads, checks that the
experiment and the dataset agree before anything is built, and makes the per-worker
``tf.data`` pipelines (with next-token targets for language models).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from research.data.input_pipeline import ImageAugmentation, make_dataset
from research.data.manifest import DatasetError, Manifest, load_manifest
from research.experiments.config import ExperimentConfig
from research.models.gpt import next_token_pairs
from research.models.specs import (
    HeadSpec,
    InputSpec,
    head_spec_from_feature,
    input_spec_from_feature,
)
from training.errors import TrainingSetupError


@dataclass(frozen=True)
class ModelIO:
    inputs: dict[str, InputSpec]
    heads: dict[str, HeadSpec]
    language_model: bool

    @property
    def lm_input(self) -> str:
        return next(iter(self.inputs))

    @property
    def lm_head(self) -> str:
        return next(iter(self.heads))


def open_manifest(config: ExperimentConfig) -> Manifest:
    try:
        manifest = load_manifest(config.resolve(config.data.dataset))
    except DatasetError as exc:
        raise TrainingSetupError(f"data.dataset: {exc}") from None
    for key in ("train_split", "eval_split", "test_split"):
        split = getattr(config.data, key)
        if split is not None and split not in manifest.splits:
            raise TrainingSetupError(
                f"data.{key}: the dataset has no split {split!r} (it has {sorted(manifest.splits)})"
            )
    return manifest


def model_io(config: ExperimentConfig, manifest: Manifest) -> ModelIO:
    """Named inputs and heads, checked against the dataset's features and labels."""
    features = manifest.features
    wanted_inputs = config.data.features or [n for n, f in features.items() if not f.is_label]
    for name in wanted_inputs:
        if name not in features:
            raise TrainingSetupError(
                f"data.features: the dataset has no feature {name!r} "
                f"(it has {sorted(features)})"
            )
        if features[name].is_label:
            raise TrainingSetupError(f"data.features: {name!r} is a label, not an input")
    inputs = {
        name: input_spec_from_feature(features[name], sequence_length=config.data.sequence_length)
        for name in wanted_inputs
    }
    if config.heads is not None:
        heads = dict(config.heads)
    else:
        wanted_labels = config.data.labels or list(manifest.labels)
        unknown = [name for name in wanted_labels if name not in manifest.labels]
        if unknown:
            raise TrainingSetupError(
                f"data.labels: not labels of the dataset: {unknown} (labels: {manifest.labels})"
            )
        weights = config.training.loss_weights
        heads = {
            name: head_spec_from_feature(features[name], loss_weight=weights.get(name, 1.0))
            for name in wanted_labels
        }
    language_model = any(head.kind == "language_model" for head in heads.values())
    if language_model and (len(inputs) != 1 or inputs[next(iter(inputs))].kind != "tokens"):
        raise TrainingSetupError(
            "heads: a language_model head needs exactly one text input (data.features)"
        )
    if not language_model:
        for name in heads:
            if name not in manifest.labels:
                raise TrainingSetupError(f"heads.{name}: the dataset has no label {name!r}")
    if not heads:
        raise TrainingSetupError("heads: the dataset has no labels; name heads in the experiment")
    unknown_weights = sorted(set(config.training.loss_weights) - set(heads))
    if unknown_weights:
        raise TrainingSetupError(f"training.loss_weights: no such heads: {unknown_weights}")
    return ModelIO(inputs=inputs, heads=heads, language_model=language_model)


def steps_per_epoch(manifest: Manifest, split: str, batch_size: int) -> int:
    return max(1, math.ceil(manifest.splits[split].num_records / batch_size))


def _as_label_dict(io: ModelIO) -> Any:
    heads = list(io.heads)

    def convert(features: Mapping[str, tf.Tensor], labels: Any = None) -> Any:
        if io.language_model:
            inputs, targets = next_token_pairs(features[io.lm_input])
            return {io.lm_input: inputs}, {io.lm_head: targets}
        if not isinstance(labels, Mapping):
            labels = {heads[0]: labels}
        return features, {name: labels[name] for name in heads}

    return convert


def training_dataset(
    config: ExperimentConfig,
    io: ModelIO,
    *,
    micro_batch: int,
    input_context: tf.distribute.InputContext | None,
) -> tf.data.Dataset:
    """The endless, shuffled stream of micro-batches one worker trains on."""
    data = config.data
    augment = None
    if data.augment is not None:
        augment = ImageAugmentation(
            flip=data.augment.flip,
            crop_padding=data.augment.crop_padding,
            brightness_delta=data.augment.brightness,
        )
    dataset = make_dataset(
        config.resolve(data.dataset),
        data.train_split,
        batch_size=micro_batch,
        shuffle=True,
        seed=config.seed,
        repeat=True,
        cache=data.cache,
        shuffle_buffer=data.shuffle_buffer,
        input_context=input_context,
        augment=augment,
        token_dropout=data.token_dropout,
        sequence_length=data.sequence_length,
        features=list(io.inputs) if not io.language_model else [io.lm_input],
        drop_remainder=True,
    )
    return dataset.map(_as_label_dict(io), num_parallel_calls=tf.data.AUTOTUNE)


def evaluation_dataset(
    config: ExperimentConfig, io: ModelIO, split: str, batch_size: int
) -> tf.data.Dataset:
    """One ordered pass over ``split``."""
    dataset = make_dataset(
        config.resolve(config.data.dataset),
        split,
        batch_size=batch_size,
        shuffle=False,
        sequence_length=config.data.sequence_length,
        features=list(io.inputs) if not io.language_model else [io.lm_input],
        verify="size",
    )
    return dataset.map(_as_label_dict(io), num_parallel_calls=tf.data.AUTOTUNE)
