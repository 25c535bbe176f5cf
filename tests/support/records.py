"""Fixture datasets written straight as TFRecord shards plus a manifest, with no Beam build.

A test of the input pipeline, of preprocessing or of a serving signature wants a dataset
whose every record it chose; writing the shards directly takes milliseconds where a Beam
build takes seconds. Every text feature is tokenized with one small sentencepiece model.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm
import tensorflow as tf
from PIL import Image

from contracts.dataset_manifest import Manifest, ShardInfo, SplitInfo, write_manifest
from contracts.digests import file_sha256
from contracts.features import FeatureSpec, encode_example
from research.data.input_pipeline import PAD_ID
from research.data.spec import VocabSpec
from research.data.tokenizer import train_tokenizer

Record = dict[str, Any]

WORDS = [
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
    "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon",
]  # fmt: skip
# Every text feature of a fixture dataset is tokenized with this model; a word of WORDS is
# one token, other text falls back to smaller pieces.
TOKENIZER = train_tokenizer([" ".join(WORDS)] * 20 + list(WORDS), VocabSpec(size=64), "fixture")
PROCESSOR = spm.SentencePieceProcessor(model_proto=TOKENIZER)


def encode(text: str, length: int | None = None) -> list[int]:
    """The ids sentencepiece itself gives ``text``, padded or truncated to ``length``."""
    ids = PROCESSOR.encode(text)
    if length is None:
        return ids
    return ids[:length] + [PAD_ID] * (length - len(ids))


def png(array: np.ndarray) -> bytes:
    """``array`` (height, width, channels) as PNG bytes, the way a dataset stores an image."""
    buffer = io.BytesIO()
    image = array[:, :, 0] if array.shape[2] == 1 else array
    Image.fromarray(image.astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def write_dataset(
    root: Path,
    features: Sequence[FeatureSpec],
    splits: Mapping[str, Sequence[Sequence[Record]]],
    *,
    labels: Sequence[str] = (),
    compression: str = "none",
    statistics: Mapping[str, Any] | None = None,
) -> Manifest:
    """Write ``split -> shards -> records`` as TFRecord shards plus a manifest.

    Every text feature gets ``TOKENIZER`` as its model.
    """
    root.mkdir(parents=True, exist_ok=True)
    specs = {spec.name: with_tokenizer(root, spec) for spec in features}
    options = tf.io.TFRecordOptions(compression_type="GZIP" if compression == "gzip" else "")
    split_infos = {}
    for split, shards in splits.items():
        infos = []
        for index, records in enumerate(shards):
            name = f"{split}-{index:05d}-of-{len(shards):05d}.tfrecord"
            path = root / name
            with tf.io.TFRecordWriter(str(path), options) as writer:
                for record in records:
                    writer.write(encode_example(record, specs))
            infos.append(ShardInfo(name, len(records), file_sha256(path), os.path.getsize(path)))
        split_infos[split] = SplitInfo(split, tuple(infos))
    manifest = Manifest(
        name="fixture",
        spec_hash="0" * 64,
        compression=compression,
        features=specs,
        labels=list(labels),
        splits=split_infos,
        statistics=dict(statistics or {}),
    )
    write_manifest(root, manifest)
    return manifest


def with_tokenizer(root: Path, spec: FeatureSpec) -> FeatureSpec:
    """``spec`` with ``TOKENIZER`` written beside the shards as its model, if it is text."""
    if spec.type != "text":
        return spec
    path = root / "tokenizers" / f"{spec.name}.model"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(TOKENIZER)
    return replace(
        spec,
        tokenizer_file=f"tokenizers/{spec.name}.model",
        tokenizer_sha256=file_sha256(path),
        vocab_size=PROCESSOR.get_piece_size(),
    )
