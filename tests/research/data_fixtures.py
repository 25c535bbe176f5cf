"""Raw inputs, spec files and shard readers for whole-build dataset tests.

The inputs are small but real: scikit-learn's digits, the synthetic corpus with its
ground truth, and hand-written CSV files whose every row is known, so a test can
say exactly which records a build must write.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from PIL import Image

from contracts.dataset_manifest import load_manifest
from research.data.sources import check_sources, is_record, read_source_file
from research.data.spec import DatasetSpec
from slipway.cli import main as slipway_main

EXAMPLE_SPECS = Path(__file__).resolve().parents[2] / "examples" / "data"
COLOURS = ("red", "green", "blue")


def slipway(*argv: str | Path) -> int:
    """Run ``slipway ARGV...`` in this process and return its exit code."""
    return slipway_main([str(arg) for arg in argv])


def copy_example_spec(name: str, directory: Path) -> Path:
    """Copy ``examples/data/<name>`` beside the raw data its relative paths point at."""
    directory.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(EXAMPLE_SPECS / name, directory / name))


def write_spec(path: Path, spec: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


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
    return [example for examples in read_examples(dataset).values() for example in examples]


def text_of(example: dict[str, list], name: str) -> str:
    return example[name][0].decode("utf-8")


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
    manifest = load_manifest(dataset)
    return {
        shard.path: shard.sha256 for split in manifest.splits.values() for shard in split.shards
    }


# --------------------------------------------------------------------------- digits


def write_digits(raw: Path, duplicates: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as ``digits.npz`` and as a ``digits_images/<class>/`` folder.

    The images at positions ``duplicates`` are written a second time (same pixels,
    same class) at the end, so the build has known duplicates to merge. Returns the
    images (N x 8 x 8 uint8) and labels as written, duplicates included.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    labels = digits.target
    images = np.concatenate([images, images[list(duplicates)]])
    labels = np.concatenate([labels, labels[list(duplicates)]])
    raw.mkdir(parents=True, exist_ok=True)
    np.savez(raw / "digits.npz", images=images, target=labels)
    for index, (image, label) in enumerate(zip(images, labels, strict=True)):
        folder = raw / "digits_images" / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image, mode="L").save(folder / f"{index:04d}.png")
    return images, labels


# --------------------------------------------------------------------------- tables


def tabular_rows(
    count: int,
    seed: int,
    *,
    shift: float = 0.0,
    colour_weights: Sequence[float] = (1.0, 1.0, 1.0),
) -> list[dict[str, Any]]:
    """Rows ``{id, x, colour, note}``: ``x`` ~ N(10 + shift, 2), colours by weight."""
    rng = np.random.default_rng(seed)
    weights = np.asarray(colour_weights, dtype=np.float64)
    colours = rng.choice(len(COLOURS), size=count, p=weights / weights.sum())
    words = ("calm", "bright", "river", "stone", "quiet", "meadow", "signal", "harbour")
    return [
        {
            "id": index,
            "x": round(float(rng.normal(10.0 + shift, 2.0)), 4),
            "colour": COLOURS[colours[index]],
            "note": " ".join(rng.choice(words, size=int(rng.integers(3, 9)))),
        }
        for index in range(count)
    ]


def write_tabular_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    lines = ["id,x,colour,note"]
    lines.extend(f"{row['id']},{row['x']},{row['colour']},{row['note']}" for row in rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def tabular_spec(name: str, source: str = "table.csv") -> dict[str, Any]:
    """A spec for ``tabular_rows`` data with every field declared."""
    return {
        "name": name,
        "sources": [{"type": "csv", "path": source}],
        "infer_schema": False,
        "schema": {
            "id": {"type": "numeric", "dtype": "int64"},
            "x": {"type": "numeric"},
            "colour": {"type": "categorical"},
            "note": {"type": "text"},
        },
        "labels": ["colour"],
        "vocab": {"size": 64},
        "output": {"num_shards": {"train": 2, "validation": 1, "test": 1}},
    }


def write_tabular_dataset_inputs(
    directory: Path, name: str, rows: Sequence[dict[str, Any]]
) -> Path:
    """``table.csv`` plus ``<name>.yaml`` in ``directory``; returns the spec path."""
    write_tabular_csv(directory / "table.csv", rows)
    return write_spec(directory / f"{name}.yaml", tabular_spec(name))


# --------------------------------------------------------------------------- checks


def luhn_valid(digits: str) -> bool:
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char) * (2 if position % 2 else 1)
        total += value - 9 if value > 9 else value
    return total % 10 == 0


def decode_example(serialized: bytes) -> dict[str, list[Any]]:
    """Plain-Python view of an Example: key -> list of values."""
    from tensorflow.core.example import example_pb2

    example = example_pb2.Example.FromString(serialized)
    out: dict[str, list[Any]] = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[key] = list(getattr(feature, kind).value) if kind else []
    return out


def make_spec(base: Path, source: dict[str, Any], **extra: Any) -> DatasetSpec:
    """A one-source dataset spec rooted at ``base``."""
    return DatasetSpec.model_validate(
        {"name": "t", "sources": [source], "base_dir": str(base), **extra}
    )


def read(spec: DatasetSpec) -> tuple[list[dict], list[dict]]:
    """Every record and every quarantine entry the spec's sources yield, in order."""
    records, quarantined = [], []
    for unit in check_sources(spec):
        for item in read_source_file(unit):
            (records if is_record(item) else quarantined).append(item)
    return records, quarantined


def public(record: dict) -> dict:
    """A record without its bookkeeping keys."""
    return {key: value for key, value in record.items() if not key.startswith("_")}


def write_text_spec(directory: Path, texts: list[str], text: dict, **spec: Any) -> Path:
    """``texts`` as JSON Lines records ``{"id", "text"}`` and a spec that builds them
    as stored (no cleaning), split by id; ``text`` is the text field's schema and
    ``spec`` adds or replaces top-level keys."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": i, "text": value}) for i, value in enumerate(texts)]
    (directory / "texts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    base = {
        "name": "texts",
        "sources": [{"type": "jsonl", "path": "texts.jsonl"}],
        "infer_schema": False,
        "schema": {"id": {"type": "numeric", "dtype": "int64"}, "text": text},
        "clean": {"unicode_normalization": "none", "collapse_whitespace": False},
        "dedup": {"exact": {"fields": ["id"]}},
        "split": {"ratios": {"train": 0.8, "test": 0.2}, "key": "id"},
    }
    return write_spec(directory / "texts.yaml", {**base, **spec})
