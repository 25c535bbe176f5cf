"""A model whose raw-feature preprocessing runs in a SavedModel of its own.

A quantized TFLite core holds no string ops or lookup tables; its version keeps the
preprocessing as a SavedModel beside it (``contracts.model_manifest.PREPROCESSING_DIR``).
Clients still send raw features: this backend runs the preprocessing, then the model,
and offers the model's signatures with the preprocessing's inputs.
"""

from __future__ import annotations

import numpy as np

from contracts.model_manifest import SIGNATURE_KEY
from serving.backends.base import Backend, find_signature
from serving.errors import FailedPrecondition
from serving.signature import Signature


class PreprocessedBackend:
    """``model`` fed by ``preprocessing``'s serving signature (raw -> model inputs)."""

    def __init__(self, preprocessing: Backend, model: Backend) -> None:
        self._preprocessing = preprocessing
        self._model = model
        first = find_signature(preprocessing.signatures, SIGNATURE_KEY)
        self.signatures: dict[str, Signature] = {}
        for key, signature in model.signatures.items():
            missing = sorted(set(signature.inputs) - set(first.outputs))
            if missing:
                raise FailedPrecondition(
                    f"the preprocessing does not produce the model's inputs {missing}"
                )
            self.signatures[key] = Signature(key, first.inputs, signature.outputs)

    def run(
        self, signature_name: str, inputs: dict[str, np.ndarray], timeout: float | None = None
    ) -> dict[str, np.ndarray]:
        find_signature(self.signatures, signature_name)
        prepared = self._preprocessing.run(SIGNATURE_KEY, inputs, timeout)
        return self._model.run(signature_name, prepared, timeout)

    def close(self) -> None:
        self._model.close()
        self._preprocessing.close()
