"""Publishing a compressed model as a new version of a model repository.

The version holds ``model.tflite`` always and, when the method kept Keras weights
(pruned, clustered, float), a SavedModel with the same ``serving_default`` signature,
so the gateway can serve either. ``slipway.json`` vouches for every file and records
what was done (method and its details), how the result measured (the evaluation that
passed the quality gate) and where it came from (source version and its provenance,
dataset, code commit). The version appears atomically through
``contracts.model_repository.publish_version``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compression.evaluate import Evaluation, TFLiteRunner
from compression.loading import LoadedModel, named_inputs
from compression.result import CompressedModel
from contracts.dataset_manifest import Manifest
from contracts.model_manifest import PREPROCESSING_DIR, write_model_manifest
from contracts.model_repository import publish_version
from contracts.serving_contract import (
    OVERRIDE_FLAG,
    check_contract,
    latest_signature,
    with_class_name_outputs,
)
from research.preprocessing.preprocessor import FeaturePreprocessor
from training.export import git_commit, save_preprocessing, save_serving_model
from training.publish import class_names

TFLITE_FILE = "model.tflite"


@dataclass(frozen=True)
class Source:
    """The version a compressed model was made from."""

    directory: Path
    loaded: LoadedModel

    @property
    def name(self) -> str:
        return str(self.loaded.manifest.get("name") or self.directory.resolve().parent.name)

    @property
    def version(self) -> int | str:
        version = self.loaded.manifest.get("version")
        return version if version is not None else self.directory.resolve().name

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "version": self.version,
            "path": str(self.directory.resolve()),
            "metrics": self.loaded.manifest.get("metrics"),
            "provenance": self.loaded.manifest.get("provenance"),
        }


def flat_metrics(evaluation: Evaluation) -> dict[str, float]:
    """The evaluation as ``slipway.json`` metrics: one number per name, as training writes."""
    metrics: dict[str, float] = {"examples": float(evaluation.examples)}
    metrics.update({f"{head}_accuracy": value for head, value in evaluation.accuracy.items()})
    metrics.update({f"{head}_mae": value for head, value in evaluation.mae.items()})
    if evaluation.agreement is not None:
        metrics.update({f"{name}_agreement": value for name, value in evaluation.agreement.items()})
    if evaluation.max_abs_diff is not None:
        metrics["max_abs_diff"] = evaluation.max_abs_diff
    metrics.update(
        {
            "tflite_bytes": float(evaluation.size_bytes),
            "tflite_gzip_bytes": float(evaluation.gzip_bytes),
            "latency_p50_ms": evaluation.latency_p50_ms,
            "latency_p99_ms": evaluation.latency_p99_ms,
            "throughput": evaluation.throughput,
        }
    )
    return metrics


def token_lengths(model: Any) -> dict[str, int | None]:
    """Each sequence input's length, which its tokenizer pads and truncates to."""
    return {
        name: tensor.shape[1]
        for name, tensor in named_inputs(model).items()
        if tensor.shape.rank == 2
    }


def publish_compressed(
    compressed: CompressedModel,
    evaluation: Evaluation,
    *,
    source: Source,
    data_manifest: Manifest,
    dataset_dir: str | Path,
    split: str,
    repository: str | Path,
    model_name: str | None = None,
    compression: dict[str, Any] | None = None,
    allow_contract_change: bool = False,
) -> tuple[int, Path]:
    """Write ``compressed`` as ``<repository>/<model_name>/<next version>/``.

    ``model_name`` defaults to the source model's name; ``compression`` adds to the
    manifest's ``compression`` section (the quality gate, the report's location). The
    version must keep the serving contract of the newest version already published
    under that name (else of the source version): ``ContractChangeError`` names each
    difference, unless ``allow_contract_change``.
    """
    name = model_name or source.name
    published = latest_signature(Path(repository), name)
    stable, against = (
        (published[1], f"{name} version {published[0]}")
        if published is not None
        else (source.loaded.manifest["signature"], f"the source version {source.version}")
    )
    tflite_signature = TFLiteRunner(compressed.tflite).signature()
    labels = source.loaded.manifest.get("labels", {})
    # The version is served as its source is: raw where the source preprocesses in graph.
    preprocessor = FeaturePreprocessor.for_inputs(
        data_manifest,
        source.loaded.raw_inputs,
        dataset_dir=dataset_dir,
        sequence_lengths=token_lengths(source.loaded.model),
    )

    def write(directory: Path) -> None:
        if compressed.keras_model is not None:
            signature = save_serving_model(
                compressed.keras_model, directory, preprocessor, class_names(labels)
            )
        elif preprocessor.layers:
            # The TFLite core takes preprocessed inputs: clients send raw features to the
            # preprocessing SavedModel beside it, whose inputs the version's signature lists.
            raw = save_preprocessing(preprocessor, directory / PREPROCESSING_DIR)
            inputs = {
                input_name: raw["inputs"].get(input_name, spec)
                for input_name, spec in tflite_signature["inputs"].items()
            }
            signature = {**tflite_signature, "inputs": inputs}
        else:
            signature = tflite_signature
        # The gateway answers a TFLite core's class names from the labels, as a SavedModel.
        signature = with_class_name_outputs(signature, labels)
        if not allow_contract_change:
            check_contract(stable, signature, against=against, override=OVERRIDE_FLAG)
        (directory / TFLITE_FILE).write_bytes(compressed.tflite)
        write_model_manifest(
            directory,
            {
                "name": name,
                "signature": signature,
                "labels": labels,
                "preprocessing": {"inputs": sorted(preprocessor.layers)},
                "metrics": {split: flat_metrics(evaluation)},
                "provenance": {
                    "method": compressed.method,
                    "source": source.to_json(),
                    "dataset": data_manifest.name,
                    "data_manifest_hash": data_manifest.file_hash(),
                    "git_commit": git_commit(Path.cwd()),
                },
                "compression": {
                    "method": compressed.method,
                    "details": compressed.details,
                    "tflite": {"file": TFLITE_FILE, "signature": tflite_signature},
                    "evaluation": evaluation.to_json(),
                    **(compression or {}),
                },
            },
        )

    return publish_version(Path(repository).resolve(), name, write)
