"""What ``slipway data show`` prints: each feature's statistics, and records as stored.

Statistics come from the manifest (the split that scales features: train, else the
largest); records are read from the split's first shards with the project's own TFRecord
reader, so looking at a dataset does not start TensorFlow's input pipeline.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Mapping
from typing import Any

from PIL import Image

from contracts.dataset_manifest import Manifest
from contracts.features import FeatureSpec
from research.data import filesystems
from research.data.tfrecord_files import read_records

VALUES_SHOWN = 4  # values of a vector shown before "…"
TEXT_SHOWN = 48  # characters of a text shown before "…"
TOP_CATEGORIES = 3


def statistics_line(stats: Mapping[str, Any]) -> str:
    """One feature's statistics in a line: ``mean 0.52 ± 0.29 in [0.03, 0.98]; 0 missing``."""
    if not stats:
        return "-"
    kind = stats.get("type")
    if kind == "numeric" and stats.get("count"):
        summary = (
            f"mean {_number(stats.get('mean'))} ± {_number(stats.get('std'))} "
            f"in [{_number(stats.get('min'))}, {_number(stats.get('max'))}]"
        )
    elif kind == "categorical":
        frequencies = stats.get("frequencies") or {}
        top = ", ".join(
            f"{name} {count:,}" for name, count in list(frequencies.items())[:TOP_CATEGORIES]
        )
        summary = f"{stats.get('num_distinct', len(frequencies))} distinct; most: {top}"
    elif kind == "text":
        lengths = stats.get("length_quantiles") or {}
        summary = f"length median {lengths.get('p50', '-')}, p95 {lengths.get('p95', '-')} chars"
    else:
        summary = f"{stats.get('count', 0):,} present"
    return f"{summary}; {stats.get('missing', 0):,} missing"


def first_records(
    root: str, manifest: Manifest, split: str, count: int
) -> Iterator[dict[str, str]]:
    """Up to ``count`` records of ``split`` as stored, each feature's value as text."""
    from tensorflow.core.example import example_pb2

    shown = 0
    for shard in manifest.splits[split].shards:
        with filesystems.open_for_read(filesystems.join(root, shard.path)) as stream:
            for record in read_records(stream, manifest.compression):
                if shown == count:
                    return
                example = example_pb2.Example.FromString(record)
                yield {
                    name: stored_value_text(feature, example.features.feature.get(name))
                    for name, feature in manifest.features.items()
                }
                shown += 1


def stored_value_text(feature: FeatureSpec, stored: Any) -> str:
    """A stored ``tf.train.Feature`` as a short text: images by format and size, vectors
    by their first values, long text cut."""
    if stored is None:
        return "(missing)"
    kind = stored.WhichOneof("kind")
    values = list(getattr(stored, kind).value) if kind else []
    if not values:
        return "(missing)"
    if feature.type == "image":
        return _image(values[0])
    if kind == "bytes_list":
        texts = [_text(value.decode("utf-8", errors="replace")) for value in values]
        return texts[0] if len(texts) == 1 else _listed(texts)
    numbers = [_number(value) for value in values]
    return numbers[0] if len(numbers) == 1 else _listed(numbers)


def _image(data: bytes) -> str:
    if not data:
        return "(missing image)"
    try:
        with Image.open(io.BytesIO(data)) as image:
            return f"{image.format} {image.width}x{image.height} {image.mode}, {len(data):,} bytes"
    except (OSError, ValueError):
        return f"not an image, {len(data):,} bytes"


def _listed(values: list[str]) -> str:
    shown = ", ".join(values[:VALUES_SHOWN])
    more = f", … ({len(values)} values)" if len(values) > VALUES_SHOWN else ""
    return f"[{shown}{more}]"


def _text(value: str) -> str:
    flat = " ".join(value.split())
    return flat if len(flat) <= TEXT_SHOWN else flat[: TEXT_SHOWN - 1] + "…"


def _number(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)
