"""Publishing a trained model as a new version in a model repository.

The version directory holds the SavedModel and ``slipway.json`` (checksums, signature,
held-out metrics, label classes and provenance), and appears atomically, so a gateway
polling the repository never sees half a version.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import tf_keras as keras

from contracts.dataset_manifest import Manifest
from contracts.model_manifest import write_model_manifest
from contracts.model_repository import publish_version
from research.experiments.model_io import ModelIO
from research.experiments.task import ExperimentTask
from training.export import git_commit, save_serving_model


def label_descriptions(io: ModelIO, manifest: Manifest) -> dict[str, dict[str, Any]]:
    """What each output means, so clients can turn class indices back into names."""
    described: dict[str, dict[str, Any]] = {}
    for name, head in io.heads.items():
        entry: dict[str, Any] = {"kind": head.kind}
        feature = manifest.features.get(name)
        vocabulary = feature.vocabulary if feature is not None else ()
        if head.kind == "classification" and len(vocabulary) == head.num_classes:
            entry["classes"] = list(vocabulary)
        described[name] = entry
    return described


def class_names(labels: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Head -> class names, for the heads ``label_descriptions`` gives classes."""
    return {name: entry["classes"] for name, entry in labels.items() if "classes" in entry}


def publish_model(
    model: keras.Model,
    task: ExperimentTask,
    *,
    metrics: dict[str, dict[str, float]],
    method: str,
    extra: dict[str, Any] | None = None,
    is_chief: bool = True,
) -> tuple[int, Path] | None:
    """Export ``model`` into ``<model_root>/<model_name>/<next version>/``.

    In a multi-worker run every worker must save (reading per-replica variables is a
    collective); only the chief publishes, the others save into a scratch directory.
    """
    config, manifest = task.config, task.manifest
    model = task.serving_model(model)
    name = config.export.model_name or config.name
    labels = label_descriptions(task.io, manifest)
    preprocessor = task.build_preprocessor()

    def save(directory: Path) -> dict[str, Any]:
        return save_serving_model(model, directory, preprocessor, class_names(labels))

    if not is_chief:
        with tempfile.TemporaryDirectory(prefix="slipway-export-") as scratch:
            save(Path(scratch) / "model")
        return None

    def write(directory: Path) -> None:
        signature = save(directory)
        write_model_manifest(
            directory,
            {
                "name": name,
                "signature": signature,
                "labels": labels,
                "preprocessing": {"inputs": sorted(preprocessor.layers)},
                "metrics": metrics,
                "provenance": {
                    "experiment": config.name,
                    "config_hash": config.config_hash(),
                    "data_manifest_hash": manifest.file_hash(),
                    "dataset": manifest.name,
                    "git_commit": git_commit(Path(config.base_dir)),
                    "method": method,
                    **({"model_fn": task.model_fn_name} if task.model_fn_name else {}),
                    **(extra or {}),
                },
            },
        )

    return publish_version(config.resolve(config.export.model_root).resolve(), name, write)
