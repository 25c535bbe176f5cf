"""Small real source models for compression tests, published as training publishes them.

Three zoo families on three real datasets built by the data pipeline: an MLP on the
64-value digits vectors, the CNN on the 8x8 digits images and a Transformer classifier
on the generated text corpus. Each is trained briefly (enough to be far above chance)
and exported with training's own export functions into a model repository, so the
compression code reads exactly the artifact a user would hand it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tf_keras as keras
import yaml

from compression.finetune import fine_tune, training_data
from contracts.dataset_manifest import load_manifest
from contracts.model_manifest import write_model_manifest
from contracts.model_repository import publish_version
from research.data.pipeline import build_dataset
from research.data.spec import load_spec
from research.data.synthetic import write_corpus_jsonl
from research.experiments.model_io import ModelIO
from research.models import head_spec_from_feature, input_spec_from_feature
from research.models.registry import build_model
from research.preprocessing.preprocessor import FeaturePreprocessor
from tests.training.experiments import build_digits_dataset
from training.export import save_serving_model
from training.publish import class_names, label_descriptions

SEQUENCE_LENGTH = 24

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

CORPUS_SPEC = {
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

# family -> (model config, training epochs); sized so int8 weights dominate the CNN's file.
FAMILIES: dict[str, tuple[dict[str, Any], int]] = {
    "mlp": ({"type": "mlp", "hidden_units": [32]}, 6),
    "cnn": ({"type": "cnn", "stem_filters": 16, "stages": [48]}, 4),
    "transformer": (
        {"type": "transformer", "num_layers": 1, "d_model": 16, "num_heads": 2, "ff_dim": 32},
        8,
    ),
}
DATASET_OF = {"mlp": "vectors", "cnn": "images", "transformer": "text"}


@dataclass(frozen=True)
class SourceModel:
    """A published source version and the dataset it was trained on."""

    version_dir: Path
    dataset_dir: Path


def _build(directory: Path, spec: dict[str, Any]) -> Path:
    path = directory / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    build_dataset(load_spec(path), directory / "dataset")
    return directory / "dataset"


def build_images_dataset(directory: Path) -> Path:
    """scikit-learn's digits as 8x8 single-channel images."""
    from sklearn.datasets import load_digits

    directory.mkdir(parents=True, exist_ok=True)
    digits = load_digits()
    images = (digits.images * (255.0 / 16.0)).round().astype(np.uint8)
    np.savez(directory / "digits.npz", images=images, target=digits.target)
    return _build(directory, IMAGES_SPEC)


def build_text_dataset(directory: Path) -> Path:
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
    return _build(directory, CORPUS_SPEC)


BUILDERS = {
    "vectors": build_digits_dataset,
    "images": build_images_dataset,
    "text": build_text_dataset,
}


def train_and_publish(family: str, dataset_dir: Path, model_root: Path) -> Path:
    """Train ``family`` briefly on ``dataset_dir`` and publish it; the version directory."""
    config, epochs = FAMILIES[family]
    manifest = load_manifest(dataset_dir)
    feature_names = [n for n, f in manifest.features.items() if n not in manifest.labels]
    inputs = {
        name: input_spec_from_feature(manifest.features[name], sequence_length=SEQUENCE_LENGTH)
        for name in feature_names
    }
    heads = {name: head_spec_from_feature(manifest.features[name]) for name in manifest.labels}
    keras.utils.set_random_seed(0)
    model = build_model(config, inputs, heads)
    train = training_data(dataset_dir, model, heads, batch_size=64)
    history = fine_tune(model, train, heads, epochs=epochs, learning_rate=3e-3, seed=0)
    labels = label_descriptions(ModelIO(inputs=inputs, heads=heads), manifest)
    preprocessor = FeaturePreprocessor.for_inputs(
        manifest,
        inputs,
        dataset_dir=dataset_dir,
        sequence_lengths={name: SEQUENCE_LENGTH for name in inputs},
    )

    def write(directory: Path) -> None:
        signature = save_serving_model(model, directory, preprocessor, class_names(labels))
        write_model_manifest(
            directory,
            {
                "name": family,
                "signature": signature,
                "labels": labels,
                "preprocessing": {"inputs": sorted(preprocessor.layers)},
                "metrics": {"train": {name: values[-1] for name, values in history.items()}},
                "provenance": {"dataset": manifest.name, "method": "float32"},
            },
        )

    _, version_dir = publish_version(model_root, family, write)
    return version_dir


def publish_source(family: str, workdir: Path) -> SourceModel:
    """Build the family's dataset under ``workdir`` and publish a trained model there."""
    dataset_dir = BUILDERS[DATASET_OF[family]](workdir / "data")
    return SourceModel(train_and_publish(family, dataset_dir, workdir / "models"), dataset_dir)
