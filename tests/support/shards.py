"""What a dataset build wrote, read back independently of the input pipeline.

Shards are read with TensorFlow's own TFRecord reader and decoded to plain Python, and
directories are compared by content, so a build test checks the files themselves.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from contracts.dataset_manifest import load_manifest


def read_examples(dataset: Path, split: str | None = None) -> dict[str, list[dict[str, list]]]:
    """Every record of the dataset's shards (or one split's), decoded, per split.

    Read with TensorFlow's own TFRecord reader, independently of the input pipeline.
    """
    import tensorflow as tf

    manifest = load_manifest(dataset)
    splits = [split] if split is not None else list(manifest.splits)
    out: dict[str, list[dict[str, list]]] = {}
    for name in splits:
        paths = manifest.shard_paths(dataset, name)
        records = tf.data.TFRecordDataset(paths, compression_type=manifest.tfrecord_compression)
        out[name] = [decode_example(serialized) for serialized in records.as_numpy_iterator()]
    return out


def all_examples(dataset: Path) -> list[dict[str, list]]:
    """Every record of every split, for a check that holds whatever the split."""
    return [example for examples in read_examples(dataset).values() for example in examples]


def text_of(example: dict[str, list], name: str) -> str:
    """A decoded record's text feature as a string (shards hold it as UTF-8 bytes)."""
    return example[name][0].decode("utf-8")


def decode_example(serialized: bytes) -> dict[str, list[Any]]:
    """Plain-Python view of an Example: key -> list of values."""
    from tensorflow.core.example import example_pb2

    example = example_pb2.Example.FromString(serialized)
    out: dict[str, list[Any]] = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[key] = list(getattr(feature, kind).value) if kind else []
    return out


def png_pixels(data: bytes) -> np.ndarray:
    """Decoded pixels, always height x width x channels."""
    with Image.open(io.BytesIO(data)) as image:
        pixels = np.asarray(image)
    return pixels[..., None] if pixels.ndim == 2 else pixels


def tree_digest(root: str | Path) -> dict[str, str]:
    """SHA-256 of every file under ``root``, by relative path: equal means untouched."""
    root = Path(root)
    return {
        path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def leftovers(parent: Path, name: str) -> list[str]:
    """Hidden staging or retired directories a build left beside ``parent/name``."""
    return sorted(path.name for path in parent.glob(f".{name}.*"))


def shard_hashes(dataset: Path) -> dict[str, str]:
    """The SHA-256 the manifest records for each shard: equal means the same output."""
    manifest = load_manifest(dataset)
    return {
        shard.path: shard.sha256 for split in manifest.splits.values() for shard in split.shards
    }
