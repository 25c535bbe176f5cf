"""Writing TFRecord shards whose contents and checksums are reproducible.

Each record goes to a shard chosen by a hash of its rank, and a shard's records are
written in the order of another hash of their rank, so rebuilding the same spec over
the same inputs yields byte-identical shards (and identical SHA-256 in the manifest)
while the records of a shard are mixed across sources. Records cross the shuffle as
compressed ``tf.train.Example`` bytes with an 8-byte sort key, which keeps what the
runner holds per record small.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import apache_beam as beam

from contracts.dataset_manifest import ShardInfo
from contracts.digests import file_sha256
from contracts.features import FeatureSpec, encode_example, token_ids_key
from research.data.records import RANK, Record
from research.data.split import SPLIT


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
    directory: str | Path, name: str, examples: Iterable[bytes], compression: str
) -> ShardInfo:
    """Write serialized Examples to ``directory/name`` and describe the file."""
    import tensorflow as tf

    Path(directory).mkdir(parents=True, exist_ok=True)
    path = Path(directory) / name
    options = tf.io.TFRecordOptions(compression_type="GZIP" if compression == "gzip" else "")
    written = 0
    with tf.io.TFRecordWriter(str(path), options) as writer:
        for example in examples:
            writer.write(example)
            written += 1
    return ShardInfo(
        path=name, num_records=written, sha256=file_sha256(path), num_bytes=os.path.getsize(path)
    )


class WriteShards(beam.PTransform):
    """Records tagged with ``_split`` -> shard files in ``directory``; emits one
    ``(split, ShardInfo-as-JSON)`` per written shard."""

    def __init__(
        self,
        directory: str | Path,
        features: Mapping[str, FeatureSpec],
        shards_per_split: Mapping[str, int],
        compression: str,
    ) -> None:
        super().__init__()
        self._directory = str(directory)
        self._features = dict(features)
        self._shards = dict(shards_per_split)
        self._compression = compression

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        features, shards = self._features, self._shards
        directory, compression = self._directory, self._compression
        text_fields = [name for name, spec in features.items() if spec.type == "text"]

        def encode(record: Record) -> tuple[tuple[str, int], tuple[int, bytes]]:
            split = record[SPLIT]
            token_ids = {
                name: record[token_ids_key(name)]
                for name in text_fields
                if record.get(token_ids_key(name)) is not None
            }
            example = encode_example(record, features, token_ids)
            key = (split, shard_index(record[RANK], shards[split]))
            return key, (order_key(record[RANK]), zlib.compress(example, 1))

        def write(item: tuple[tuple[str, int], Iterable[tuple[int, bytes]]]) -> Any:
            (split, index), keyed = item
            name = shard_file_name(split, index, shards[split], compression)
            ordered = (zlib.decompress(example) for _, example in sorted(keyed))
            info = write_shard(directory, name, ordered, compression)
            return split, info.to_json()

        return (
            pcoll
            | "Encode" >> beam.Map(encode)
            | "GroupByShard" >> beam.GroupByKey()
            | "Write" >> beam.Map(write)
        )
