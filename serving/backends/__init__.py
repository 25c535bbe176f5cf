"""Ways to run a model: in-process SavedModel or TFLite, or a remote TensorFlow Serving.

``open_backend`` picks the local backend a version directory calls for; the heavy
runtimes (TensorFlow, LiteRT) are imported only when a model of that kind is opened.
"""

from __future__ import annotations

from pathlib import Path

from contracts.model_manifest import PREPROCESSING_DIR
from serving.backends.base import Backend, check_deadline, find_signature
from serving.errors import NotFound
from serving.model_files import SAVED_MODEL_FILE, TFLITE_FILE, model_format

__all__ = ["Backend", "check_deadline", "find_signature", "open_backend"]


def open_backend(version_dir: str | Path, *, num_threads: int = 1) -> Backend:
    """A backend for the model in ``version_dir`` (SavedModel preferred over TFLite).

    ``num_threads`` is the TFLite interpreter's intra-op thread count. A TFLite model
    with a preprocessing SavedModel beside it takes raw features through it.
    """
    kind = model_format(version_dir)
    if kind == "savedmodel":
        from serving.backends.savedmodel import SavedModelBackend

        return SavedModelBackend(version_dir)
    if kind == "tflite":
        from serving.backends.tflite import TFLiteBackend

        model = TFLiteBackend(Path(version_dir) / TFLITE_FILE, num_threads=num_threads)
        preprocessing = Path(version_dir) / PREPROCESSING_DIR
        if not (preprocessing / SAVED_MODEL_FILE).is_file():
            return model
        from serving.backends.preprocessed import PreprocessedBackend
        from serving.backends.savedmodel import SavedModelBackend

        return PreprocessedBackend(SavedModelBackend(preprocessing), model)
    raise NotFound(f"{version_dir}: no {SAVED_MODEL_FILE} or {TFLITE_FILE}")
