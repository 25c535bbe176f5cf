"""Small real source models for compression tests, published as training publishes them.

Three zoo families on three real datasets built by the data pipeline: an MLP on the
64-value digits vectors, the CNN on the 8x8 digits images and a Transformer classifier
on the generated topic corpus. Each is trained briefly (enough to be far above chance)
and exported with training's own export functions into a model repository, so the
compression code reads exactly the artifact a user would hand it. Training one takes
seconds to a minute, so each family is trained once per test run and shared read-only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tf_keras as keras

from compression.finetune import fine_tune, training_data
from contracts.dataset_manifest import load_manifest
from contracts.model_manifest import write_model_manifest
from contracts.model_repository import publish_version
from research.experiments.model_io import ModelIO
from research.models import head_spec_from_feature, input_spec_from_feature
from research.models.registry import build_model
from research.preprocessing.preprocessor import FeaturePreprocessor
from tests.support.artefacts import shared_artefact
from tests.support.datasets import shared_digits, shared_images, shared_topics
from training.export import save_serving_model
from training.publish import class_names, label_descriptions

SEQUENCE_LENGTH = 24

# family -> (model config, training epochs); sized so int8 weights dominate the CNN's file.
FAMILIES: dict[str, tuple[dict[str, Any], int]] = {
    "mlp": ({"type": "mlp", "hidden_units": [32]}, 6),
    "cnn": ({"type": "cnn", "stem_filters": 16, "stages": [48]}, 4),
    "transformer": (
        {"type": "transformer", "num_layers": 1, "d_model": 16, "num_heads": 2, "ff_dim": 32},
        8,
    ),
}


@dataclass(frozen=True)
class SourceModel:
    """A published source version and the dataset it was trained on."""

    version_dir: Path
    dataset_dir: Path


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


# family -> the shared dataset it is trained on
DATASETS: dict[str, Callable[[pytest.TempPathFactory], Path]] = {
    "mlp": shared_digits,
    "cnn": shared_images,
    "transformer": shared_topics,
}


def published_source(tmp_path_factory: pytest.TempPathFactory, family: str) -> SourceModel:
    """This run's trained and published ``family`` model, trained by its first caller."""
    dataset_dir = DATASETS[family](tmp_path_factory)
    root = shared_artefact(
        tmp_path_factory,
        f"{family}-source",
        lambda directory: train_and_publish(family, dataset_dir, directory / "models"),
    )
    (version,) = (root / "models" / family).iterdir()
    return SourceModel(version, dataset_dir)
