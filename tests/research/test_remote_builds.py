"""A whole build from and to URIs: sources read and the dataset published through
Beam's FileSystems, on a filesystem that is not the local disk and has no folders."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from contracts.dataset_manifest import MANIFEST_FILE, DatasetExistsError
from research.data.pipeline import build_dataset
from research.data.quality import BuildRejectedError
from research.data.spec import DatasetSpec
from tests.support.memory_filesystem import MemoryFileSystem

BUCKET = "memtest://bucket"
ROWS = "".join(f"{i},note number {i},{i % 3}\n" for i in range(300))
LINES = "".join(
    f'{{"id": {1000 + i}, "note": "json line {i}", "label": {i % 3}}}\n' for i in range(200)
)


def spec(base: str, csv: str = "raw/table.csv") -> DatasetSpec:
    return DatasetSpec.model_validate(
        {
            "name": "remote",
            "base_dir": ".",
            "sources": [
                {"type": "csv", "path": f"{base}/{csv}"},
                {"type": "jsonl", "path": f"{base}/raw/*.jsonl"},
            ],
            "labels": ["label"],
            "split": {"key": "id"},
            "output": {"num_shards": 2},
        }
    )


@pytest.fixture
def bucket() -> dict[str, bytes]:
    MemoryFileSystem.files.clear()
    MemoryFileSystem.files.update(
        {
            f"{BUCKET}/raw/table.csv": ("id,note,label\n" + ROWS).encode(),
            f"{BUCKET}/raw/lines.jsonl": LINES.encode(),
            f"{BUCKET}/raw/empty.csv": b"id,note,label\n",
        }
    )
    return MemoryFileSystem.files


def examples_in(directory: Path) -> list[bytes]:
    import tensorflow as tf

    paths = sorted(str(path) for path in directory.glob("*.tfrecord"))
    return sorted(record.numpy() for record in tf.data.TFRecordDataset(paths))


def dataset_files(bucket: dict[str, bytes], prefix: str) -> dict[str, bytes]:
    return {
        path[len(prefix) + 1 :]: data
        for path, data in bucket.items()
        if path.startswith(prefix + "/")
    }


def test_a_build_reads_and_publishes_through_uris_as_it_would_locally(
    bucket: dict[str, bytes], tmp_path: Path
) -> None:
    local_raw = tmp_path / "raw"
    local_raw.mkdir()
    (local_raw / "table.csv").write_bytes(bucket[f"{BUCKET}/raw/table.csv"])
    (local_raw / "lines.jsonl").write_bytes(bucket[f"{BUCKET}/raw/lines.jsonl"])
    local = build_dataset(spec(str(tmp_path)), tmp_path / "local")

    remote = build_dataset(spec(BUCKET), f"{BUCKET}/datasets/remote")

    assert remote.output_dir == f"{BUCKET}/datasets/remote"
    files = dataset_files(bucket, remote.output_dir)
    manifest = json.loads(files[MANIFEST_FILE])
    shards = {
        s["path"]: s["sha256"] for split in manifest["splits"].values() for s in split["shards"]
    }
    # Origins name URIs there and relative paths here, so records are ranked, and
    # sharded, differently; the records themselves are the same.
    copied = tmp_path / "copied"
    copied.mkdir()
    for name in shards:
        (copied / name).write_bytes(files[name])
    assert examples_in(copied) == examples_in(tmp_path / "local")
    assert {"report.json", "quarantine.jsonl", "dropped.jsonl", *shards} <= set(files)
    assert not any(name.startswith("_build") or ".tmp" in name for name in files)
    assert not any(".building-" in path for path in bucket)
    assert remote.report["records_written"] == local.report["records_written"]


def test_overwrite_on_a_bucket_replaces_every_file_and_a_refused_build_touches_nothing(
    bucket: dict[str, bytes],
) -> None:
    destination = f"{BUCKET}/datasets/remote"
    build_dataset(spec(BUCKET), destination)
    bucket[f"{destination}/train-00007-of-00009.tfrecord"] = b"left by an older build"
    before = dataset_files(bucket, destination)

    with pytest.raises(DatasetExistsError, match="--overwrite"):
        build_dataset(spec(BUCKET), destination)
    empty = spec(BUCKET, "raw/empty.csv").model_dump(by_alias=True)
    empty["sources"] = empty["sources"][:1]
    empty["infer_schema"] = False
    empty["schema"] = {
        "id": {"type": "numeric"},
        "note": {"type": "text"},
        "label": {"type": "categorical"},
    }
    with pytest.raises(BuildRejectedError, match="no records"):
        build_dataset(DatasetSpec.model_validate(empty), destination, overwrite=True)
    assert dataset_files(bucket, destination) == before

    build_dataset(spec(BUCKET), destination, overwrite=True)
    after = dataset_files(bucket, destination)
    assert "train-00007-of-00009.tfrecord" not in after
    assert after.keys() == before.keys() - {"train-00007-of-00009.tfrecord"}


def test_a_dataset_in_a_bucket_validates_and_shows_where_it_is(
    bucket: dict[str, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    from research.data.cli import run_show
    from research.data.validate import validate_dataset

    remote = build_dataset(spec(BUCKET), f"{BUCKET}/datasets/remote")
    assert validate_dataset(remote.output_dir).ok
    run_show(argparse.Namespace(dataset=remote.output_dir, examples=2, split="test"))
    shown = " ".join(capsys.readouterr().out.split())
    assert "remote" in shown and "the first 2 records of 'test'" in shown

    shard = next(path for path in bucket if path.endswith(".tfrecord"))
    bucket[shard] = bucket[shard][:-3]
    checks = {problem.check for problem in validate_dataset(remote.output_dir).errors}
    assert {"shard.size", "shard.checksum", "shard.unreadable"} <= checks
    del bucket[f"{remote.output_dir}/{MANIFEST_FILE}"]
    assert validate_dataset(remote.output_dir).not_datasets == [remote.output_dir]
