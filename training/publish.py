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

from research.data.manifest import Manifest
from research.experiments.config import ExperimentConfig
from research.experiments.model_io import ModelIO
from training.export import (
    git_commit,
    publish_version,
    save_serving_model,
    write_model_manifest,
)


def label_descriptions(io: ModelIO, manifest: Manifest) -> dict[str, dict[str, Any]]:
    """What each output means, so clients can turn class indices back into names."""
    described: dict[str, dict[str, Any]] = {}
    for name, head in io.heads.items():
        entry: dict[str, Any] = {"kind": head.kind}
        feature = manifest.features.get(name)
        if head.kind == "classification" and feature is not None and feature.vocabulary:
            entry["classes"] = list(feature.vocabulary)
        described[name] = entry
    return described


def publish_model(
    model: keras.Model,
    config: ExperimentConfig,
    manifest: Manifest,
    io: ModelIO,
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
    name = config.export.model_name or config.name
    if not is_chief:
        with tempfile.TemporaryDirectory(prefix="slipway-export-") as scratch:
            save_serving_model(model, Path(scratch) / "model")
        return None

    def write(directory: Path) -> None:
        signature = save_serving_model(model, directory)
        write_model_manifest(
            directory,
            {
                "name": name,
                "signature": signature,
                "labels": label_descriptions(io, manifest),
                "metrics": metrics,
                "provenance": {
                    "experiment": config.name,
                    "config_hash": config.config_hash(),
                    "data_manifest_hash": manifest.file_hash(),
                    "dataset": manifest.name,
                    "git_commit": git_commit(Path(config.base_dir)),
                    "method": method,
                    **(extra or {}),
                },
            },
        )

    return publish_version(config.resolve(config.export.model_root).resolve(), name, write)


def export_from_checkpoint(config: ExperimentConfig) -> tuple[int, Path]:
    """Publish the weights of the experiment's latest committed checkpoint."""
    from training.errors import TrainingSetupError
    from training.trainer import Trainer

    trainer = Trainer(config, verbose=False)
    trainer.prepare()
    step = trainer.keeper.restore_latest()
    if step is None:
        raise TrainingSetupError(
            f"checkpoint.directory: no committed checkpoint in {config.checkpoint_path}"
        )
    metrics = {
        split: trainer.evaluate(split)
        for split in (config.data.eval_split, config.data.test_split)
        if split is not None
    }
    return publish_model(
        trainer.model,
        config,
        trainer.manifest,
        trainer.io,
        metrics=metrics,
        method=trainer.precision,
        extra={"checkpoint_step": step},
    )
