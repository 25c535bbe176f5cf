"""``manifest.json``: the description every dataset directory carries.

It records the feature spec, the shards of each split with their record counts and
SHA-256, per-split statistics, the tokenizers (``vocabularies``: text feature -> its
sentencepiece model file) and the spec hash. Readers trust a
dataset only as far as its manifest vouches for it.

Statistics layout (per split, under ``statistics[split]``)::

    {"num_records": N,
     "features": {
        "<numeric>":     {"type": "numeric", "count", "missing", "min", "max", "mean", "std",
                          "as_read": {"mean", "std"}},  # only with clip or transform
        "<categorical>": {"type": "categorical", "count", "missing", "num_distinct",
                          "frequencies": {value: count}},
        "<text>":        {"type": "text", "count", "missing",
                          "length_quantiles": {"p0", "p5", "p25", "p50", "p75", "p95", "p100"},
                          "token_quantiles": {...same keys...}},
        "<image>":       {"type": "image", "count", "missing"}}}
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts.atomic_files import write_json_atomically
from contracts.features import FeatureSpec, features_from_json, features_to_json

MANIFEST_FILE = "manifest.json"
FORMAT = "slipway.dataset/1"
QUANTILES = (0, 5, 25, 50, 75, 95, 100)
TRAIN_SPLIT = "train"


class DatasetError(ValueError):
    """A dataset directory is missing, incomplete or does not match its manifest."""


class DatasetExistsError(DatasetError, FileExistsError):
    """The destination already holds a dataset and replacing it was not requested."""


@dataclass(frozen=True)
class ShardInfo:
    path: str  # relative to the dataset directory
    num_records: int
    sha256: str
    num_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "num_records": self.num_records,
            "sha256": self.sha256,
            "num_bytes": self.num_bytes,
        }


@dataclass(frozen=True)
class SplitInfo:
    name: str
    shards: tuple[ShardInfo, ...]

    @property
    def num_records(self) -> int:
        return sum(shard.num_records for shard in self.shards)


@dataclass
class Manifest:
    name: str
    spec_hash: str
    compression: str  # "none" | "gzip"
    features: dict[str, FeatureSpec]
    labels: list[str]
    splits: dict[str, SplitInfo]
    statistics: dict[str, Any] = field(default_factory=dict)
    vocabularies: dict[str, str] = field(default_factory=dict)
    created: str = ""
    provenance: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT

    @property
    def tfrecord_compression(self) -> str:
        """The compression argument ``tf.data.TFRecordDataset`` expects."""
        return "GZIP" if self.compression == "gzip" else ""

    @property
    def statistics_split(self) -> str | None:
        """The split whose statistics scale features and targets: ``train``, else the
        largest. Scaling by the split a model is evaluated on would leak it into the model.
        """
        if TRAIN_SPLIT in self.splits:
            return TRAIN_SPLIT
        if not self.splits:
            return None
        return max(self.splits, key=lambda name: self.splits[name].num_records)

    def feature_statistics(self, name: str) -> dict[str, Any]:
        """Feature ``name``'s statistics over ``statistics_split`` (empty if none)."""
        split = self.statistics_split
        by_split = self.statistics.get(split, {}) if split else {}
        return dict((by_split.get("features") or {}).get(name) or {})

    def shard_paths(self, root: str | Path, split: str) -> list[str]:
        if split not in self.splits:
            raise DatasetError(f"{root}: no split {split!r}; the dataset has {sorted(self.splits)}")
        return [str(Path(root) / shard.path) for shard in self.splits[split].shards]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "name": self.name,
            "created": self.created,
            "spec_hash": self.spec_hash,
            "compression": self.compression,
            "features": features_to_json(self.features),
            "labels": list(self.labels),
            "splits": {
                name: {
                    "num_records": split.num_records,
                    "shards": [shard.to_json() for shard in split.shards],
                }
                for name, split in self.splits.items()
            },
            "statistics": self.statistics,
            "vocabularies": self.vocabularies,
            "provenance": self.provenance,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        splits = {
            name: SplitInfo(
                name=name,
                shards=tuple(
                    ShardInfo(
                        path=shard["path"],
                        num_records=int(shard["num_records"]),
                        sha256=shard["sha256"],
                        num_bytes=int(shard["num_bytes"]),
                    )
                    for shard in split["shards"]
                ),
            )
            for name, split in data["splits"].items()
        }
        return cls(
            name=data["name"],
            spec_hash=data["spec_hash"],
            compression=data.get("compression", "none"),
            features=features_from_json(data["features"]),
            labels=list(data.get("labels", [])),
            splits=splits,
            statistics=data.get("statistics", {}),
            vocabularies=dict(data.get("vocabularies", {})),
            created=data.get("created", ""),
            provenance=dict(data.get("provenance", {})),
            format=data.get("format", FORMAT),
        )

    def file_hash(self) -> str:
        """SHA-256 of the manifest's canonical JSON: what a model records as its data."""
        canonical = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def load_manifest(root: str | Path) -> Manifest:
    """Read ``root/manifest.json``; a missing or malformed one is a DatasetError."""
    path = Path(root) / MANIFEST_FILE
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"{root}: not a dataset (no {MANIFEST_FILE})") from None
    except OSError as exc:
        raise DatasetError(f"{path}: unreadable manifest: {exc}") from None
    return parse_manifest(text, str(path))


def parse_manifest(text: bytes | str, where: str) -> Manifest:
    """The manifest in ``text`` (read from ``where``, which errors name), checked: for
    readers that fetch the file their own way (object stores)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise DatasetError(f"{where}: unreadable manifest: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DatasetError(f"{where}: not a {FORMAT} manifest")
    try:
        return Manifest.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise DatasetError(f"{where}: malformed manifest: {exc!r}") from None


def write_manifest(root: str | Path, manifest: Manifest) -> None:
    write_json_atomically(Path(root) / MANIFEST_FILE, manifest.to_json())
