"""Shards framed without TensorFlow are TFRecord files to TensorFlow's own reader,
byte for byte what its writer makes, and a dataset build no longer imports it."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

from contracts.dataset_manifest import load_manifest
from research.data.shards import write_shard
from research.data.tfrecord_files import (
    CorruptRecordError,
    DigestingReader,
    TFRecordWriter,
    read_records,
)
from tests.support.raw_data import tabular_rows, tabular_spec, write_spec, write_tabular_csv
from tests.support.shards import all_examples

COMPRESSIONS = ["none", "gzip"]
GZIP_HEADER_SIZE = 10  # magic, method, flags, mtime, extra flags, OS: no payload
RECORDS = [
    b"",
    "naïve 数据 🚀".encode(),
    bytes(range(256)) * 9000,  # 2.3 MB: longer than the writer's buffered chunk
    *(f"record {i}".encode() * (i % 40) for i in range(2000)),
]


def tf_compression(compression: str) -> str:
    return "GZIP" if compression == "gzip" else ""


def tf_read(path: Path, compression: str) -> list[bytes]:
    dataset = tf.data.TFRecordDataset(str(path), compression_type=tf_compression(compression))
    return list(dataset.as_numpy_iterator())


def tf_written(path: Path, records: list[bytes], compression: str) -> bytes:
    options = tf.io.TFRecordOptions(compression_type=tf_compression(compression))
    with tf.io.TFRecordWriter(str(path), options) as writer:
        for record in records:
            writer.write(record)
    return path.read_bytes()


def ours(records: list[bytes], compression: str) -> bytes:
    out = io.BytesIO()
    with TFRecordWriter(out, compression) as writer:
        for record in records:
            writer.write(record)
    return out.getvalue()


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_tensorflow_reads_every_record_back(tmp_path: Path, compression: str) -> None:
    info = write_shard(str(tmp_path), "train.tfrecord", iter(RECORDS), compression)
    path = tmp_path / "train.tfrecord"
    assert tf_read(path, compression) == RECORDS
    data = path.read_bytes()
    assert (info.num_records, info.num_bytes) == (len(RECORDS), len(data))
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.tfrecord"]  # no leftovers


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_the_bytes_are_those_tensorflows_writer_makes(tmp_path: Path, compression: str) -> None:
    """So shards keep their SHA-256 across rebuilds, and with datasets TF wrote."""
    written = ours(RECORDS, compression)
    assert written == tf_written(tmp_path / "tf.tfrecord", RECORDS, compression)
    assert written == ours(RECORDS, compression)
    if compression == "gzip":
        assert written[4:8] == b"\0\0\0\0", "a gzip mtime would change the bytes every run"


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_an_empty_shard_is_a_valid_file(tmp_path: Path, compression: str) -> None:
    info = write_shard(str(tmp_path), "empty.tfrecord", [], compression)
    path = tmp_path / "empty.tfrecord"
    assert info.num_records == 0 and tf_read(path, compression) == []
    assert path.read_bytes() == tf_written(tmp_path / "tf.tfrecord", [], compression)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_tensorflows_reader_catches_any_flipped_bit(tmp_path: Path, compression: str) -> None:
    """Lengths, records and checksums alike; for gzip, everything past its header,
    whose other fields are descriptive (flags, time, operating system)."""
    written = ours([b"", b"abc", "naïve".encode() * 5], compression)
    first = GZIP_HEADER_SIZE if compression == "gzip" else 0
    path = tmp_path / "corrupt.tfrecord"
    missed = []
    for position in range(first, len(written)):
        corrupt = bytearray(written)
        corrupt[position] ^= 0x01
        path.write_bytes(corrupt)
        try:
            tf_read(path, compression)
        except tf.errors.DataLossError:
            continue
        missed.append(position)
    assert missed == []


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_the_reader_reads_what_tensorflow_wrote_and_digests_it(
    tmp_path: Path, compression: str
) -> None:
    written = tf_written(tmp_path / "tf.tfrecord", RECORDS, compression)
    stream = DigestingReader(io.BytesIO(written))
    assert list(read_records(stream, compression)) == RECORDS
    stream.drain()
    assert (stream.num_bytes, stream.sha256) == (len(written), hashlib.sha256(written).hexdigest())


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_the_reader_refuses_any_flipped_bit_and_any_cut_as_tensorflow_does(
    tmp_path: Path, compression: str
) -> None:
    records = [b"", b"abc", "naïve".encode() * 5]
    written = ours(records, compression)
    first = GZIP_HEADER_SIZE if compression == "gzip" else 0

    def read(data: bytes) -> list[bytes]:
        read_back: list[bytes] = []
        with pytest.raises(CorruptRecordError):
            read_back.extend(read_records(io.BytesIO(data), compression))
        return read_back

    for position in range(first, len(written)):
        corrupt = bytearray(written)
        corrupt[position] ^= 0x01
        assert records[: len(read(bytes(corrupt)))] == read(bytes(corrupt))
    for length in range(1, len(written)):
        if compression == "none" and length in (12 + 4, 2 * 12 + 3 + 2 * 4):
            continue  # a cut between records leaves a shorter, sound file
        assert records[: len(read(written[:length]))] == read(written[:length])


def test_an_unknown_compression_is_refused() -> None:
    with pytest.raises(ValueError, match="compression must be one of"):
        TFRecordWriter(io.BytesIO(), "zlib")


@pytest.mark.process
def test_a_dataset_build_never_imports_tensorflow(tmp_path: Path) -> None:
    """Each worker process would pay its import, about 0.6 GiB, for nothing."""
    rows = tabular_rows(60, seed=3)
    write_tabular_csv(tmp_path / "table.csv", rows)
    spec = tabular_spec("no-tf")
    spec["output"]["compression"] = "gzip"
    spec_path = write_spec(tmp_path / "no-tf.yaml", spec)
    probe = (
        "import sys\n"
        "from research.data.pipeline import build_dataset\n"
        "from research.data.spec import load_spec\n"
        f"build_dataset(load_spec({str(spec_path)!r}), {str(tmp_path / 'out')!r})\n"
        "loaded = sorted(name for name in sys.modules if name.split('.')[0] == 'tensorflow')\n"
        "assert not loaded, f'the build imported {loaded[:5]}'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = load_manifest(tmp_path / "out")
    written = sum(split.num_records for split in manifest.splits.values())
    assert 0 < written == len(all_examples(tmp_path / "out"))
