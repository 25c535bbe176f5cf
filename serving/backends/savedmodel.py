"""Run a SavedModel in this process with TensorFlow.

Signatures come from the loaded object's concrete functions, which TensorFlow makes
safe to call from several threads at once, so one loaded model serves every batcher
thread. The ``SignatureDef`` protos in ``saved_model.pb`` add what the functions do
not carry (method name, graph tensor names) for ``GetModelMetadata``.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import numpy as np

from serving.backends.base import check_deadline, find_signature, model_failure
from serving.errors import InvalidArgument, Unavailable
from serving.model_files import SAVED_MODEL_FILE
from serving.signature import PREDICT_METHOD, Signature, TensorSpec

SERVE_TAG = "serve"


def _register_text_ops() -> None:
    """Register tensorflow_text's ops, which a model that tokenizes raw text calls
    (research.preprocessing.text); without them such a SavedModel does not load. A
    gateway without the package still serves every other model."""
    with contextlib.suppress(ImportError):
        import tensorflow_text  # noqa: F401


class SavedModelBackend:
    """A SavedModel loaded with ``tf.saved_model.load`` (tag ``serve``)."""

    def __init__(self, path: str | Path) -> None:
        import tensorflow as tf

        self._tf = tf
        self.path = Path(path)
        _register_text_ops()
        self._model: Any = tf.saved_model.load(str(self.path), tags=[SERVE_TAG])
        self._functions = dict(self._model.signatures)
        definitions = _signature_defs(self.path)
        self.signatures: dict[str, Signature] = {
            key: _describe(key, function, definitions.get(key))
            for key, function in self._functions.items()
        }
        self._closed = threading.Event()

    def run(
        self, signature_name: str, inputs: dict[str, np.ndarray], timeout: float | None = None
    ) -> dict[str, np.ndarray]:
        if self._closed.is_set():
            raise Unavailable(f"{self.path}: the model has been unloaded")
        find_signature(self.signatures, signature_name)
        check_deadline(timeout)
        function = self._functions[signature_name]
        try:
            tensors = {name: self._tf.convert_to_tensor(value) for name, value in inputs.items()}
            outputs = function(**tensors)
        except TypeError as exc:
            raise InvalidArgument(f"signature {signature_name!r}: {exc}") from None
        except Exception as exc:
            raise model_failure(exc, inputs) from exc
        return {name: tensor.numpy() for name, tensor in outputs.items()}

    def close(self) -> None:
        """Drop the model; TensorFlow frees it once in-flight calls release it."""
        self._closed.set()
        self._functions = {}
        self._model = None


def _signature_defs(path: Path) -> dict[str, Any]:
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel.FromString((path / SAVED_MODEL_FILE).read_bytes())
    for meta_graph in saved.meta_graphs:
        if SERVE_TAG in meta_graph.meta_info_def.tags:
            return dict(meta_graph.signature_def)
    return {}


def _describe(key: str, function: Any, definition: Any) -> Signature:
    _, keyword_specs = function.structured_input_signature
    tensor_names = {}
    if definition is not None:
        tensor_names = {
            name: info.name
            for infos in (definition.inputs, definition.outputs)
            for name, info in infos.items()
        }

    def spec(name: str, tensor_spec: Any) -> TensorSpec:
        shape = tensor_spec.shape
        dims = None if shape.rank is None else tuple(shape.as_list())
        return TensorSpec(name, tensor_spec.dtype.as_numpy_dtype, dims, tensor_names.get(name, ""))

    return Signature(
        key,
        {name: spec(name, s) for name, s in keyword_specs.items()},
        {name: spec(name, s) for name, s in function.structured_outputs.items()},
        definition.method_name
        if definition is not None and definition.method_name
        else PREDICT_METHOD,
    )
