"""Small real datasets built by the data pipeline, each once per test run.

Training and compression tests need a dataset the way a user's run reads one: shards,
manifest and tokenizers written by ``build_dataset``. A Beam build takes seconds, so each
dataset here is built by the first test that asks for it and shared, read-only, by every
later test and every pytest-xdist worker (``tests/support/artefacts.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from research.data.pipeline import build_dataset
from research.data.spec import load_spec
from research.data.synthetic import write_corpus_jsonl
from tests.support.artefacts import shared_artefact

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# A vocabulary size every mesh of the mesh tests divides (1, 2 and 4 model parts).
CORPUS_VOCABULARY = 256

DIGITS_SPEC = """
name: digits-vectors
sources:
  - type: npz
    path: digits.npz
    arrays: {pixels: pixels, target: label}
schema:
  pixels: {type: numeric, dtype: float32, shape: [64]}
  label: {type: categorical}
labels: [label]
dedup:
  exact: {enabled: false}
split:
  ratios: {train: 0.8, validation: 0.1, test: 0.1}
output:
  num_shards: {train: 2, validation: 1, test: 1}
"""

IMAGES_SPEC = {
    "name": "digits-images",
    "sources": [
        {
            "type": "npz",
            "path": "digits.npz",
            "arrays": {"images": "image", "target": "label"},
            "images": ["image"],
        }
    ],
    "schema": {"image": {"type": "image", "height": 8, "width": 8, "channels": 1}},
    "labels": ["label"],
    "dedup": {"exact": {"enabled": False}},
    "split": {"ratios": {"train": 0.8, "validation": 0.1, "test": 0.1}},
    "output": {"num_shards": {"train": 2, "validation": 1, "test": 1}},
}

TOPICS_SPEC = {
    "name": "corpus",
    "sources": [{"type": "jsonl", "path": "corpus.jsonl"}],
    "infer_schema": False,
    "schema": {"text": {"type": "text"}, "topic": {"type": "categorical"}},
    "labels": ["topic"],
    "clean": {"pii": {"enabled": False}},
    "dedup": {"exact": {"enabled": False}},
    "vocab": {"size": 300},
    "output": {"num_shards": {"train": 2, "validation": 1, "test": 1}},
}


def build_digits_dataset(directory: Path) -> Path:
    """scikit-learn's digits as 64-value vectors (pixels scaled to [0, 1])."""
    from sklearn.datasets import load_digits

    directory.mkdir(parents=True, exist_ok=True)
    digits = load_digits()
    pixels = (digits.data / 16.0).astype(np.float32)
    np.savez(directory / "digits.npz", pixels=pixels, target=digits.target)
    (directory / "spec.yaml").write_text(DIGITS_SPEC)
    build_dataset(load_spec(directory / "spec.yaml"), directory / "dataset")
    return directory / "dataset"


def build_corpus_dataset(
    directory: Path, documents: int = 400, seed: int = 7, vocabulary: int = CORPUS_VOCABULARY
) -> Path:
    """The generated text corpus, built with the example spec and a ``vocabulary``-piece
    sentencepiece model instead of the example's."""
    directory.mkdir(parents=True, exist_ok=True)
    write_corpus_jsonl(directory / "corpus.jsonl", documents, seed=seed)
    spec = yaml.safe_load((EXAMPLES / "data" / "corpus.yaml").read_text(encoding="utf-8"))
    spec["vocab"]["size"] = vocabulary
    (directory / "corpus.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    build_dataset(load_spec(directory / "corpus.yaml"), directory / "dataset")
    return directory / "dataset"


def build_images_dataset(directory: Path) -> Path:
    """scikit-learn's digits as 8x8 single-channel images."""
    from sklearn.datasets import load_digits

    directory.mkdir(parents=True, exist_ok=True)
    digits = load_digits()
    images = (digits.images * (255.0 / 16.0)).round().astype(np.uint8)
    np.savez(directory / "digits.npz", images=images, target=digits.target)
    return _build_from(directory, IMAGES_SPEC)


def build_topics_dataset(directory: Path) -> Path:
    """The generated corpus classified by topic (no planted duplicates or personal data)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_corpus_jsonl(
        directory / "corpus.jsonl",
        600,
        seed=5,
        duplicate_rate=0.0,
        near_duplicate_rate=0.0,
        pii_rate=0.0,
        num_classes=3,
    )
    return _build_from(directory, TOPICS_SPEC)


def _build_from(directory: Path, spec: dict[str, Any]) -> Path:
    path = directory / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    build_dataset(load_spec(path), directory / "dataset")
    return directory / "dataset"


def shared_digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This run's digits vectors dataset, built by its first caller."""
    return shared_artefact(tmp_path_factory, "digits", build_digits_dataset) / "dataset"


def shared_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This run's generated corpus (400 documents, a 256-piece vocabulary)."""
    return shared_artefact(tmp_path_factory, "corpus", build_corpus_dataset) / "dataset"


def shared_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This run's digits images dataset."""
    return shared_artefact(tmp_path_factory, "digit-images", build_images_dataset) / "dataset"


def shared_topics(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This run's topic classification corpus."""
    return shared_artefact(tmp_path_factory, "topics", build_topics_dataset) / "dataset"
