"""Writing TFRecord shards whose contents and checksums are reproducible.

Each record goes to a shard chosen by a hash of its rank, and a shard's records are
written in the order of another hash of their rank, so rebuilding the same spec over
the same inputs yields byte-identical shards (and identical SHA-256 in the manifest),
on every runner, while the records of a shard are mixed across sources.

Shards are made by an external merge sort (``research.data.sorted_runs``), so no
worker ever holds a whole shard: each bundle encodes its records (compressed
``tf.train.Example`` bytes with an 8-byte sort key) into sorted runs per shard in the
build's scratch directory; only the runs' paths cross the shuffle, and one task per
shard streams a merge of its runs into the shard.

Everything is written through Beam's ``FileSystems`` (see ``research.data.filesystems``),
so the scratch and dataset directories may be remote: a shard is framed (and gzipped)
without TensorFlow, whose import would cost each worker process far more memory than
the build needs, straight into a temporary name that is renamed when complete; a failed
or retried worker leaves no half shard.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import apache_beam as beam

from contracts.dataset_manifest import ShardInfo
from contracts.features import FeatureSpec, encode_example
from research.data import filesystems
from research.data.records import RANK, Record
from research.data.sorted_runs import Item, WriteSortedRuns, merge_runs
from research.data.split import SPLIT
from research.data.tfrecord_files import TFRecordWriter


def shard_file_name(split: str, index: int, count: int, compression: str) -> str:
    suffix = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
    return f"{split}-{index:05d}-of-{count:05d}{suffix}"


def shard_index(rank: str, count: int) -> int:
    digest = hashlib.blake2b(rank.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def order_key(rank: str) -> int:
    """Where a record goes within its shard: stable, and independent of the shard choice."""
    digest = hashlib.blake2b(rank.encode("utf-8"), digest_size=8, person=b"order").digest()
    return int.from_bytes(digest, "big")


def write_shard(
    directory: str | os.PathLike[str],
    name: str,
    examples: Iterable[bytes],
    compression: str,
    temp_dir: str | None = None,
) -> ShardInfo:
    """Write serialized Examples to ``directory/name`` and describe the file.

    Records are framed (see ``research.data.tfrecord_files``) straight into the
    destination's temporary (in ``temp_dir``, see ``filesystems.atomic_output``), which
    becomes the shard once complete; its digest and size are taken on the way.
    """
    destination = filesystems.join(os.fspath(directory), name)
    with (
        filesystems.atomic_output(destination, temp_dir) as out,
        TFRecordWriter(out, compression) as writer,
    ):
        for example in examples:
            writer.write(example)
    return ShardInfo(
        path=name, num_records=writer.num_records, sha256=writer.sha256, num_bytes=writer.num_bytes
    )


ShardKey = tuple[str, int]  # (split, shard index)


class WriteShards(beam.PTransform):
    """Records tagged with ``_split`` -> shard files in ``directory``; emits one
    ``(split, ShardInfo-as-JSON)`` per written shard.

    Sorted runs and unfinished shards go to ``temp_dir``, which every worker must be
    able to read and which the caller removes once the pipeline is done.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        features: Mapping[str, FeatureSpec],
        shards_per_split: Mapping[str, int],
        compression: str,
        temp_dir: str,
    ) -> None:
        super().__init__()
        self._directory = os.fspath(directory)
        self._temp_dir = temp_dir
        self._features = dict(features)
        self._shards = dict(shards_per_split)
        self._compression = compression

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        shards, compression = self._shards, self._compression
        directory, temp_dir = self._directory, self._temp_dir

        def write(item: tuple[ShardKey, Iterable[str]]) -> tuple[str, dict[str, Any]]:
            (split, index), runs = item
            name = shard_file_name(split, index, shards[split], compression)
            merged = merge_runs(sorted(runs), temp_dir)
            examples = (zlib.decompress(example) for _, example in merged)
            info = write_shard(directory, name, examples, compression, temp_dir)
            return split, info.to_json()

        encode = _ShardItem(self._features, shards)
        return (
            pcoll
            | "SortedRuns" >> beam.ParDo(WriteSortedRuns(encode, temp_dir, "shard"))
            | "GroupRunsByShard" >> beam.GroupByKey()
            | "Merge" >> beam.Map(write)
        )


class _ShardItem:
    """A record -> its shard and its sorted-run item: the order key and the compressed
    ``tf.train.Example``."""

    def __init__(self, features: Mapping[str, FeatureSpec], shards: Mapping[str, int]) -> None:
        self._features = dict(features)
        self._shards = dict(shards)

    def __call__(self, record: Record) -> tuple[ShardKey, Item]:
        example = encode_example(record, self._features)
        split, rank = record[SPLIT], record[RANK]
        key = (split, shard_index(rank, self._shards[split]))
        return key, (order_key(rank).to_bytes(8, "big"), zlib.compress(example, 1))
