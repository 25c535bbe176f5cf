"""Shards and side files written through Beam's FileSystems, to a filesystem that is
not the local disk: a URI must reach it intact, and a failed write must leave nothing."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import tensorflow as tf

from research.data import filesystems
from research.data.shards import write_shard
from research.data.spec import VocabSpec
from research.data.tokenizer import save_field_files, train_tokenizer
from tests.support.memory_filesystem import MemoryFileSystem


@pytest.fixture
def bucket() -> dict[str, bytes]:
    MemoryFileSystem.files.clear()
    return MemoryFileSystem.files


def examples(count: int) -> list[bytes]:
    return [
        tf.train.Example(
            features=tf.train.Features(
                feature={"n": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}
            )
        ).SerializeToString()
        for i in range(count)
    ]


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_a_shard_reaches_a_uri_whole_and_described(
    bucket: dict[str, bytes], tmp_path: Any, compression: str
) -> None:
    name = "train-00000-of-00001.tfrecord" + (".gz" if compression == "gzip" else "")
    info = write_shard(
        "memtest://bucket/ds", name, examples(50), compression, "memtest://bucket/ds/_build/tmp"
    )
    assert list(bucket) == [f"memtest://bucket/ds/{name}"]
    data = bucket[f"memtest://bucket/ds/{name}"]
    assert (info.num_records, info.num_bytes) == (50, len(data))
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    local = tmp_path / name
    local.write_bytes(data)  # written once: FileSystems must not gzip a .gz name again
    dataset = tf.data.TFRecordDataset(str(local), "GZIP" if compression == "gzip" else "")
    assert [record.numpy() for record in dataset] == examples(50)


def test_a_failed_write_leaves_neither_the_file_nor_its_temporary(
    bucket: dict[str, bytes],
) -> None:
    def failing() -> Any:
        yield from examples(10)
        raise RuntimeError("worker lost")

    with pytest.raises(RuntimeError, match="worker lost"):
        write_shard("memtest://bucket/ds", "train.tfrecord", failing(), "none")
    with (
        pytest.raises(ValueError, match="no JSON for this"),
        filesystems.atomic_output("memtest://bucket/ds/stats.json") as handle,
    ):
        handle.write(b"{half")
        raise ValueError("no JSON for this")
    assert bucket == {}


def test_a_replaced_file_is_never_seen_half_written(bucket: dict[str, bytes]) -> None:
    path = "memtest://bucket/ds/_build/statistics.json"
    filesystems.write_json(path, {"old": 1})
    with filesystems.atomic_output(path, "memtest://bucket/ds/_build/tmp") as handle:
        handle.write(b'{"new": ')
        assert bucket[path] == b'{\n  "old": 1\n}\n'
        handle.write(b"2}")
    assert list(bucket) == [path]
    assert filesystems.read_bytes(path) == b'{"new": 2}'


def test_a_tokenizer_model_saves_to_a_uri(bucket: dict[str, bytes]) -> None:
    import apache_beam as beam

    model = train_tokenizer(["lower lowest newer", "newest lower"] * 5, VocabSpec(size=40), "text")
    with beam.Pipeline() as pipeline:
        _ = (
            pipeline
            | beam.Create([("text", model)])
            | save_field_files("memtest://bucket/ds", "memtest://bucket/ds/_build/tmp")
        )
    assert list(bucket) == ["memtest://bucket/ds/tokenizers/text.model"]
    assert filesystems.read_bytes("memtest://bucket/ds/tokenizers/text.model") == model
