"""The ``tf.data`` input pipeline: a dataset directory and a split in, batches out.

Training and evaluation read datasets only through :func:`make_dataset`, so every
model sees the same tensors for the same manifest:

Input features go through the manifest's in-graph preprocessing
(``research.preprocessing``), the same layers the exported serving graph runs on what
clients send:

- numeric -> ``float32`` of the feature's shape, standardized with the training split's
  mean and standard deviation; a value missing from a record reads as that mean (0
  once standardized: no evidence either way), not as 0 before standardizing, which
  would be a made-up measurement many deviations from typical;
- categorical -> ``int64`` ids from the manifest vocabulary starting at 1; values the
  vocabulary lacks (and missing ones) -> 0;
- text -> ``int32`` token ids under the feature's own name, padded with ``PAD_ID`` and
  truncated to the sequence length, computed from the raw text by the dataset's
  sentencepiece model with ``research.preprocessing.text.SubwordTokenizer``, the layer
  a serving graph runs too; a text read as words -> ``float32`` ``[words_size]``, its
  TF-IDF bag (``research.preprocessing.words.WordBag``);
- image -> ``float32`` in ``[0, 1]`` of shape ``(height, width, channels)`` (a missing
  image is all zeros).

Labels are read as they are: numeric ones as ``float32``, categorical ones as their
position in the vocabulary (``len(vocabulary)`` for a value it lacks).

Elements are ``(features, labels)``: ``labels`` is the label tensor when the manifest
has one label, a dict when it has several; a dataset without labels yields the
features dict alone.

Records are batched *before* they are parsed: one vectorised ``tf.io.parse_example``
per batch costs far less than one parse per record, which is what makes this pipeline
fast. Augmentation and token dropout use stateless random ops whose seed is derived
from ``seed`` and the batch's position in the stream, so a run is reproducible and an
iterator saved in a ``tf.train.Checkpoint`` resumes at the exact batch, with the exact
augmentation, it would have produced.
"""

from __future__ import annotations

import os
import random
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tensorflow as tf

from contracts.dataset_manifest import DatasetError, Manifest, load_manifest
from contracts.digests import file_sha256
from contracts.features import FeatureSpec, parsing_spec
from research.preprocessing.preprocessor import FeaturePreprocessor
from research.preprocessing.text import PAD_ID, SubwordTokenizer, tokenizer_for

UNK_ID = 1
Verify = Literal["sha256", "size", "none"]
VERIFY_MODES: tuple[str, ...] = ("sha256", "size", "none")

# A fixed cycle length rather than AUTOTUNE: AUTOTUNE follows the machine's core count,
# and the order records come out in must not depend on the machine.
_CYCLE_LENGTH = 8


def _pipeline_options() -> tf.data.Options:
    """Options for a pipeline whose every parallel stage is sized by the core count.

    tf.data's model-based autotuning is off. It records timings for every element of
    every stage, and the record-level stages (file reads, interleave, batch) see tens of
    thousands of small elements a second: with records of a 28x28 PNG and a caption
    that bookkeeping was a quarter of the CPU time (4.4 of 18.7 us a record), and
    releasing an iterator, once per epoch under Keras, waited up to 0.6 s for the tuning
    thread. With it off, ``AUTOTUNE`` parallelism is the size of the thread pool, which
    for a decode-bound map is what tuning settles on anyway, and a private thread pool
    (``tf.data.Options().threading``) still bounds it.
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    # The only stateful ops in the pipeline read immutable state built from the dataset
    # (a lookup table from the manifest, a BPE tokenizer's model), so an iterator
    # checkpoint loses nothing by ignoring them.
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return options


@dataclass(frozen=True)
class ImageAugmentation:
    """Random image transforms for training, applied independently to every example.

    ``crop_padding`` pads the image with zeros on every side and crops it back to its
    size at a random offset (a random translation of up to that many pixels).
    ``brightness_delta`` adds one uniform value in ``[-delta, delta]`` per image and
    clips the result to ``[0, 1]``.
    """

    flip: bool = True
    crop_padding: int = 0
    brightness_delta: float = 0.0

    def __post_init__(self) -> None:
        if self.crop_padding < 0:
            raise ValueError(f"crop_padding must be >= 0, got {self.crop_padding}")
        if not 0.0 <= self.brightness_delta <= 1.0:
            raise ValueError(f"brightness_delta must be in [0, 1], got {self.brightness_delta}")


def verify_shards(
    dataset_dir: str | Path, manifest: Manifest, split: str, verify: Verify = "sha256"
) -> list[str]:
    """Check a split's shard files against the manifest and return their paths.

    ``"sha256"`` reads every byte, ``"size"`` compares lengths only and ``"none"``
    checks only that each file exists; a mismatch is a DatasetError naming the shard,
    raised before any training step could consume bad data.
    """
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
    paths = manifest.shard_paths(dataset_dir, split)
    for shard, path in zip(manifest.splits[split].shards, paths, strict=True):
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            raise DatasetError(
                f"{path}: shard {shard.path!r} of split {split!r} is missing"
            ) from None
        if verify == "none":
            continue
        if size != shard.num_bytes:
            raise DatasetError(
                f"{path}: shard {shard.path!r} has {size} bytes, the manifest says {shard.num_bytes}"
            )
        if verify == "sha256" and file_sha256(path) != shard.sha256:
            raise DatasetError(
                f"{path}: shard {shard.path!r} does not match its SHA-256 in the manifest"
            )
    return paths


def _label_names(manifest: Manifest) -> list[str]:
    names = list(manifest.labels)
    names += [n for n, spec in manifest.features.items() if spec.is_label and n not in names]
    missing = [name for name in names if name not in manifest.features]
    if missing:
        raise DatasetError(f"manifest {manifest.name!r}: labels {missing} have no feature spec")
    return names


def _select_features(
    manifest: Manifest, wanted: Sequence[str] | None
) -> tuple[dict[str, FeatureSpec], dict[str, FeatureSpec]]:
    """(input features, label features) in manifest order."""
    labels = _label_names(manifest)
    inputs = [name for name in manifest.features if name not in labels]
    if wanted is not None:
        unknown = [name for name in wanted if name not in inputs]
        if unknown:
            raise ValueError(f"features {unknown} are not input features; choose from {inputs}")
        inputs = [name for name in inputs if name in set(wanted)]
    return (
        {name: manifest.features[name] for name in inputs},
        {name: manifest.features[name] for name in labels},
    )


def default_sequence_length(manifest: Manifest, name: str) -> int | None:
    """The longest token sequence of text feature ``name`` across all splits.

    Taken from the manifest statistics (token quantile p100). The maximum over every
    split, not the split being read, so training, evaluation and a model built from
    :func:`describe_inputs` agree on one shape. ``None`` when no split has statistics
    for the feature; the pipeline then pads each batch to its own longest sequence.
    """
    lengths = []
    for split_stats in manifest.statistics.values():
        stats = (split_stats.get("features") or {}).get(name) or {}
        longest = (stats.get("token_quantiles") or {}).get("p100")
        if longest is not None:
            lengths.append(int(longest))
    return max(1, *lengths) if lengths else None


def _sequence_lengths(
    manifest: Manifest, specs: Mapping[str, FeatureSpec], sequence_length: int | None
) -> dict[str, int | None]:
    if sequence_length is not None and sequence_length < 1:
        raise ValueError(f"sequence_length must be >= 1, got {sequence_length}")
    return {
        name: sequence_length or default_sequence_length(manifest, name)
        for name, spec in specs.items()
        if spec.type == "text" and not spec.reads_words
    }


def describe_inputs(dataset_dir: str | Path, sequence_length: int | None = None) -> dict[str, Any]:
    """What :func:`make_dataset` yields, per feature, for building a model.

    Each entry has ``type``, ``shape`` (per example, ``None`` for a length decided per
    batch), ``dtype`` and ``label``; categorical inputs add ``vocab_size`` (including
    the out-of-vocabulary id), categorical labels ``num_classes``, text ``vocab_size``.
    """
    manifest = load_manifest(dataset_dir)
    inputs, labels = _select_features(manifest, None)
    lengths = _sequence_lengths(manifest, {**inputs, **labels}, sequence_length)
    described: dict[str, Any] = {}
    for is_label, specs in ((False, inputs), (True, labels)):
        for name, spec in specs.items():
            info: dict[str, Any] = {"type": spec.type, "label": is_label}
            if spec.type == "numeric":
                info["shape"] = tuple(spec.shape)
                info["dtype"] = "float32"
            elif spec.type == "categorical":
                info["shape"] = ()
                info["dtype"] = "int64"
                if is_label:
                    info["num_classes"] = len(spec.vocabulary)
                else:
                    info["vocab_size"] = len(spec.vocabulary) + 1
            elif spec.type == "text" and spec.reads_words:
                info["shape"] = (spec.words_size,)
                info["dtype"] = "float32"
            elif spec.type == "text":
                info["shape"] = (lengths[name],)
                info["dtype"] = "int32"
                info["vocab_size"] = spec.vocab_size
            else:
                info["shape"] = (spec.height, spec.width, spec.channels)
                info["dtype"] = "float32"
            described[name] = info
    return described


def training_means(manifest: Manifest, features: Mapping[str, FeatureSpec]) -> dict[str, float]:
    """Each numeric feature's mean over the training split, which a missing value reads as.

    For a feature the model reads clipped or transformed, the value it reads as the mean
    of the values as read: standardized, a missing value is 0 either way, as NaN from a
    client is.
    """
    means = {}
    for name, spec in features.items():
        if spec.type != "numeric":
            continue
        statistics = manifest.feature_statistics(name)
        if spec.reshaped:
            read = (statistics.get("as_read") or {}).get("mean")
            mean = None if read is None else spec.value_read_as(read)
        else:
            mean = statistics.get("mean")
        if mean is not None:
            means[name] = float(mean)
    return means


def _label_table(spec: FeatureSpec) -> tf.lookup.StaticHashTable | None:
    if not spec.vocabulary:
        return None
    keys = tf.constant(list(spec.vocabulary), dtype=tf.string)
    values = tf.range(len(spec.vocabulary), dtype=tf.int64)
    initializer = tf.lookup.KeyValueTensorInitializer(keys, values)
    return tf.lookup.StaticHashTable(initializer, default_value=len(spec.vocabulary))


def _stable_id(name: str) -> int:
    """A per-feature number for seeding; crc32, so it is the same in every process."""
    return zlib.crc32(name.encode("utf-8")) & 0x7FFFFFFF


def _fold(seed: tf.Tensor, value: int | tf.Tensor) -> tf.Tensor:
    return tf.random.experimental.stateless_fold_in(seed, tf.cast(value, tf.int64))


def _augment_images(images: tf.Tensor, seed: tf.Tensor, augment: ImageAugmentation) -> tf.Tensor:
    """Flip, translate and brighten each image of a batch with its own random draw."""
    flip_seed, crop_seed, brightness_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 3)
    )
    batch = tf.shape(images)[0]
    if augment.flip:
        flip = tf.random.stateless_uniform([batch], flip_seed) < 0.5
        images = tf.where(flip[:, None, None, None], tf.reverse(images, axis=[2]), images)
    if augment.crop_padding:
        pad = augment.crop_padding
        height, width = images.shape[1], images.shape[2]
        padded = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
        offsets = tf.random.stateless_uniform(
            [batch, 2], crop_seed, minval=0, maxval=2 * pad + 1, dtype=tf.int32
        )
        rows = offsets[:, :1] + tf.range(height)[None, :]
        cols = offsets[:, 1:] + tf.range(width)[None, :]
        images = tf.gather(padded, rows, axis=1, batch_dims=1)
        images = tf.gather(images, cols, axis=2, batch_dims=1)
    if augment.brightness_delta:
        delta = augment.brightness_delta
        shift = tf.random.stateless_uniform([batch, 1, 1, 1], brightness_seed, -delta, delta)
        images = tf.clip_by_value(images + shift, 0.0, 1.0)
    return images


def _drop_tokens(ids: tf.Tensor, seed: tf.Tensor, rate: float) -> tf.Tensor:
    """Replace a ``rate`` fraction of real tokens with ``UNK_ID``; padding stays padding."""
    drop = tf.random.stateless_uniform(tf.shape(ids), seed) < rate
    return tf.where(drop & (ids != PAD_ID), tf.constant(UNK_ID, ids.dtype), ids)


def _raw(spec: FeatureSpec, parsed: tf.Tensor) -> tf.Tensor:
    """A parsed input as a client sends it: numbers as float32, strings as they are."""
    return tf.cast(parsed, tf.float32) if spec.type == "numeric" else parsed


class _BatchDecoder:
    """Serialized Examples of one batch -> the ``(features, labels)`` element."""

    def __init__(
        self,
        preprocessor: FeaturePreprocessor | None,
        inputs: Mapping[str, FeatureSpec],
        labels: Mapping[str, FeatureSpec],
        label_tokenizers: Mapping[str, SubwordTokenizer],
        seed: tf.Tensor,
        augment: ImageAugmentation | None,
        token_dropout: float,
        missing: Mapping[str, float],
    ) -> None:
        self._preprocessor = preprocessor
        self._inputs = dict(inputs)
        self._labels = dict(labels)
        self._seed = seed
        self._augment = augment
        self._token_dropout = token_dropout
        self._tables = {
            name: _label_table(spec)
            for name, spec in self._labels.items()
            if spec.type == "categorical"
        }
        self._label_tokenizers = dict(label_tokenizers)
        self._parsing_spec = parsing_spec({**self._inputs, **self._labels}, missing)

    def __call__(self, index: tf.Tensor, serialized: tf.Tensor) -> Any:
        parsed = tf.io.parse_example(serialized, self._parsing_spec)
        if self._preprocessor is None:
            features = {name: _raw(spec, parsed[name]) for name, spec in self._inputs.items()}
        else:
            features = self._preprocessed(index, parsed)
        if not self._labels:
            return features
        labels = {name: self._label(name, spec, parsed) for name, spec in self._labels.items()}
        if len(labels) == 1:
            return features, next(iter(labels.values()))
        return features, labels

    def _preprocessed(self, index: tf.Tensor, parsed: Mapping[str, Any]) -> dict[str, tf.Tensor]:
        batch_seed = _fold(self._seed, index)
        features = self._preprocessor({name: parsed[name] for name in self._preprocessor.layers})
        for name, spec in self._inputs.items():
            seed = _fold(batch_seed, _stable_id(name))
            if spec.type == "text" and not spec.reads_words and self._token_dropout:
                features[name] = _drop_tokens(features[name], seed, self._token_dropout)
            elif spec.type == "image" and self._augment is not None:
                features[name] = _augment_images(features[name], seed, self._augment)
        return features

    def _label(self, name: str, spec: FeatureSpec, parsed: Mapping[str, Any]) -> tf.Tensor:
        if spec.type == "numeric":
            return tf.cast(parsed[name], tf.float32)
        if spec.type == "categorical":
            table = self._tables[name]
            if table is None:
                return tf.zeros_like(parsed[name], dtype=tf.int64)
            return table.lookup(parsed[name])
        if spec.type == "text":
            return self._label_tokenizers[name](parsed[name])
        raise DatasetError(f"label {name!r}: a {spec.type} feature cannot be a label")


def _pipeline_position(input_context: tf.distribute.InputContext | None) -> tuple[int, int]:
    if input_context is None:
        return 1, 0
    return input_context.num_input_pipelines, input_context.input_pipeline_id


_GRAPH_SEED = 1


def _epoch_seed(seed: int, epoch: tf.Tensor) -> tf.Tensor:
    """A shuffle seed of its own for every epoch, computed from the epoch's number alone,
    so a stream can begin at any epoch without replaying the ones before it."""
    return tf.random.stateless_uniform([], [seed, epoch], minval=None, maxval=None, dtype=tf.int64)


def _replica_filter(
    input_context: tf.distribute.InputContext,
) -> Any:
    """Keep the batches of one pipeline's replicas out of the global stream of batches.

    Batch ``i`` of the stream goes to replica ``i % replicas``; under
    ``distribute_datasets_from_function`` replicas ``id * local .. id * local + local - 1``
    are this pipeline's, and take its batches in turn, so each receives exactly its batch.
    """
    replicas = input_context.num_replicas_in_sync
    pipelines = input_context.num_input_pipelines
    if replicas % pipelines:
        raise ValueError(
            f"{replicas} replicas cannot be split evenly over {pipelines} input pipelines"
        )
    local = replicas // pipelines
    pipeline_id = input_context.input_pipeline_id
    return lambda index, _: tf.equal((index % replicas) // local, pipeline_id)


def make_dataset(
    dataset_dir: str | Path,
    split: str,
    *,
    batch_size: int,
    shuffle: bool | None = None,
    seed: int = 0,
    repeat: bool = False,
    cache: bool | str | Path = False,
    shuffle_buffer: int = 10_000,
    input_context: tf.distribute.InputContext | None = None,
    split_global_batches: bool = False,
    start_batch: int = 0,
    augment: ImageAugmentation | None = None,
    token_dropout: float = 0.0,
    sequence_length: int | None = None,
    features: Sequence[str] | None = None,
    verify: Verify = "sha256",
    drop_remainder: bool = False,
    deterministic: bool = True,
    raw: bool = False,
) -> tf.data.Dataset:
    """Batches of ``(features, labels)`` read from one split of a dataset directory.

    ``batch_size`` is the size of the batches this call yields; under
    ``distribute_datasets_from_function`` pass
    ``input_context.get_per_replica_batch_size(global_batch_size)``.
    ``shuffle`` defaults to on for ``"train"`` only; unshuffled, records come one from
    each shard in turn, always in the same order. ``verify`` is how far the shards are
    checked against the manifest first (see :func:`verify_shards`). ``cache`` keeps the
    serialized records of this worker in memory (``True``) or in files at the given
    path prefix (one per worker), so later epochs skip the disk. ``augment`` and
    ``token_dropout`` apply to input features only, never to labels.
    ``sequence_length`` defaults to :func:`default_sequence_length` per text feature.
    ``features`` picks a subset of the input features. ``raw`` yields the input
    features as a client sends them to a served model, before preprocessing: numbers
    as float32, category and text strings, encoded images.

    The stream is a sequence of epochs, each a pass over the records shuffled with a
    seed computed from ``seed`` and the epoch's number. So the stream's position is one
    number: ``start_batch`` begins it at that batch (the epoch it falls in is rebuilt and
    its first records skipped before anything is decoded), exactly as the stream from
    the start would have continued, augmentation included; nothing else need be saved
    to resume it.

    With ``input_context`` each input pipeline reads a disjoint part of the split: whole
    files when there are at least as many shards as pipelines, otherwise every n-th
    record (each pipeline then reads every file, in a fixed order). With
    ``split_global_batches`` instead, every pipeline reads the whole stream and keeps
    its replicas' batches: consecutive runs of ``num_replicas_in_sync`` batches are the
    global batches, batch ``i`` belongs to replica ``i % replicas``, and ``start_batch``
    counts batches of the whole stream. The global batch of every step then holds the
    same examples, and the same augmentation, whichever workers share the replicas;
    reading is repeated on every worker, decoding is not. Without ``repeat`` the last
    global batch is completed with records from the start of the split, so that every
    replica reads as many batches: whatever follows the split's ``num_records`` records
    in the stream is padding for the reader to leave out.

    ``deterministic=False`` lets decoded batches arrive in whatever order they are
    ready, so one slow batch does not hold up the others; each batch keeps its records
    and its augmentation, only the order of batches is no longer reproducible. Records
    are always read in the same order, so sharding by record stays a partition.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if shuffle_buffer < 1:
        raise ValueError(f"shuffle_buffer must be >= 1, got {shuffle_buffer}")
    if not 0.0 <= token_dropout < 1.0:
        raise ValueError(f"token_dropout must be in [0, 1), got {token_dropout}")
    if start_batch < 0:
        raise ValueError(f"start_batch must be >= 0, got {start_batch}")
    if raw and (augment is not None or token_dropout):
        raise ValueError("augment and token_dropout transform preprocessed features, not raw")
    if split_global_batches and input_context is None:
        raise ValueError("split_global_batches needs the input_context of the pipeline")
    manifest = load_manifest(dataset_dir)
    paths = verify_shards(dataset_dir, manifest, split, verify)
    counts = [shard.num_records for shard in manifest.splits[split].shards]
    inputs, labels = _select_features(manifest, features)
    lengths = _sequence_lengths(manifest, {**inputs, **labels}, sequence_length)
    label_tokenizers = {
        name: tokenizer_for(dataset_dir, spec, lengths[name])
        for name, spec in labels.items()
        if spec.type == "text"
    }
    shuffle = split == "train" if shuffle is None else shuffle
    num_pipelines, pipeline_id = _pipeline_position(input_context)
    sharded = num_pipelines > 1 and not split_global_batches
    by_record = sharded and len(paths) < num_pipelines

    order = list(range(len(paths)))
    if sharded and not by_record:
        order = order[pipeline_id::num_pipelines]
    if shuffle:
        # Once, from the seed: the file order is part of what every epoch repeats, with
        # or without the cache, and the record shuffle below mixes each epoch anew.
        random.Random(seed).shuffle(order)
    epoch_records = sum(counts[i] for i in order)
    if by_record:
        epoch_records = len(range(pipeline_id, epoch_records, num_pipelines))
    files = tf.data.Dataset.from_tensor_slices(tf.constant([paths[i] for i in order], tf.string))
    compression = manifest.tfrecord_compression
    # Files are read in turn on one thread, not by a parallel interleave: reading a
    # record is a copy out of a buffered local file, and a parallel interleave hands
    # every record between threads, which cost more than the reading it spread out
    # (2 us a record, an eighth of the whole). The parallel work is the decoding, per
    # batch, below; records come in the same order.
    records = files.interleave(
        lambda path: tf.data.TFRecordDataset(path, compression_type=compression),
        cycle_length=max(1, min(_CYCLE_LENGTH, len(order))),
    )
    if by_record:
        records = records.shard(num_pipelines, pipeline_id)
    if cache:
        # Every epoch below iterates this same dataset, so they share one cache.
        records = records.cache("" if cache is True else str(cache))

    def epoch(number: tf.Tensor) -> tf.data.Dataset:
        if not shuffle:
            return records
        # A fixed graph-level seed in this function's own graph: the order is then the
        # epoch seed's alone, whatever the program's global seed, and TensorFlow never
        # compares the symbolic op seed with 0 (it does when the global seed is 0).
        tf.compat.v1.set_random_seed(_GRAPH_SEED)
        return records.shuffle(shuffle_buffer, seed=_epoch_seed(seed, number))

    first_record = start_batch * batch_size
    first_epoch, skipped = divmod(first_record, max(epoch_records, 1))
    if repeat:
        epochs = tf.data.Dataset.counter(first_epoch)
    elif first_epoch:
        raise ValueError(f"start_batch {start_batch} is past the end of split {split!r}")
    else:
        epochs = tf.data.Dataset.range(1)
    stream = epochs.flat_map(epoch).skip(skipped)
    if split_global_batches and not repeat:
        global_records = batch_size * input_context.num_replicas_in_sync
        stream = stream.concatenate(records.repeat().take(-epoch_records % global_records))
    batches = tf.data.Dataset.zip(
        tf.data.Dataset.counter(start_batch),
        stream.batch(batch_size, drop_remainder=drop_remainder),
    )
    if split_global_batches and input_context.num_replicas_in_sync > 1:
        # A single replica keeps every batch: no filter to run on each of them.
        batches = batches.filter(_replica_filter(input_context))
    # Two batches of serialized records read ahead on their own thread: the decoding
    # map reads its next input only once a decoding slot frees up, and reading a batch
    # there left that core idle meanwhile (1.84 of 2 cores busy without this, 1.87 with).
    batches = batches.prefetch(2)

    seed_pipeline = 0 if split_global_batches else pipeline_id
    base_seed = tf.constant([seed, seed_pipeline], dtype=tf.int64)
    preprocessor = None
    if not raw:
        preprocessor = FeaturePreprocessor.for_inputs(
            manifest, inputs, dataset_dir=dataset_dir, sequence_lengths=lengths
        )
    decoder = _BatchDecoder(
        preprocessor,
        inputs,
        labels,
        label_tokenizers,
        base_seed,
        augment,
        token_dropout,
        training_means(manifest, inputs),
    )
    elements = batches.map(
        decoder, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic
    )
    options = _pipeline_options()
    if input_context is not None:
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return elements.prefetch(tf.data.AUTOTUNE).with_options(options)
