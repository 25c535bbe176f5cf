"""What the trainer feeds the model: the experiment's view of a dataset.

Turns a dataset manifest into the model's named inputs and heads, checks that the
experiment and the dataset agree before anything is built, and makes the per-worker
``tf.data`` pipelines (with next-token targets for language models).
"""

from __future__ import annotations

import math

import tensorflow as tf

from research.data.input_pipeline import ImageAugmentation, make_dataset
from research.data.manifest import DatasetError, Manifest, load_manifest
from research.experiments.config import ExperimentConfig
from research.experiments.model_io import ModelIO, as_head_labels
from training.errors import TrainingSetupError


def open_manifest(config: ExperimentConfig) -> Manifest:
    """The experiment's dataset manifest, with the splits it names checked."""
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


def steps_per_epoch(manifest: Manifest, split: str, batch_size: int) -> int:
    return max(1, math.ceil(manifest.splits[split].num_records / batch_size))


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
    return dataset.map(as_head_labels(io), num_parallel_calls=tf.data.AUTOTUNE)


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
    return dataset.map(as_head_labels(io), num_parallel_calls=tf.data.AUTOTUNE)
