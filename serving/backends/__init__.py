"""Ways to run a model: in-process SavedModel or TFLite, or a remote TensorFlow Serving.

``open_backend`` picks the local backend a version directory calls for; the heavy
runtimes (TensorFlow, LiteRT) are imported only when a model of that kind is opened.
"""

from __future__ import annotations

from pathlib import Path

from contracts.model_manifest import PREPROCESSING_DIR, read_model_manifest
from contracts.serving_contract import class_name_outputs
from serving.backends.base import Backend, check_deadline, find_signature
from serving.errors import NotFound
from serving.model_files import SAVED_MODEL_FILE, TFLITE_FILE, model_format

__all__ = ["Backend", "check_deadline", "find_signature", "open_backend"]


def open_backend(version_dir: str | Path, *, num_threads: int = 1) -> Backend:
    """A backend for the model in ``version_dir`` (SavedModel preferred over TFLite).

    ``num_threads`` is the TFLite interpreter's intra-op thread count. A TFLite model
    with a preprocessing SavedModel beside it takes raw features through it, and
    answers its classification heads' class names from ``slipway.json``.
    """
    kind = model_format(version_dir)
    if kind == "savedmodel":
        from serving.backends.savedmodel import SavedModelBackend

        return SavedModelBackend(version_dir)
    if kind == "tflite":
        return _tflite_version(Path(version_dir), num_threads)
    raise NotFound(f"{version_dir}: no {SAVED_MODEL_FILE} or {TFLITE_FILE}")


def _tflite_version(version_dir: Path, num_threads: int) -> Backend:
    """A TFLite core, fed by its preprocessing SavedModel when one is beside it, and
    answering class names as the model's SavedModel versions do."""
    from serving.backends.tflite import TFLiteBackend

    model: Backend = TFLiteBackend(version_dir / TFLITE_FILE, num_threads=num_threads)
    preprocessing = version_dir / PREPROCESSING_DIR
    if (preprocessing / SAVED_MODEL_FILE).is_file():
        from serving.backends.preprocessed import PreprocessedBackend
        from serving.backends.savedmodel import SavedModelBackend

        model = PreprocessedBackend(SavedModelBackend(preprocessing), model)
    manifest = read_model_manifest(version_dir) or {}
    class_names = class_name_outputs(manifest.get("labels") or {})
    if not class_names:
        return model
    from serving.backends.class_names import ClassNamesBackend

    return ClassNamesBackend(model, class_names)
