"""Class names beside a classification head's scores, for models that cannot hold them.

A SavedModel export answers each classification head with ``<head>_classes`` (its class
names, as TF Serving's classify signatures do). A TFLite core has no string outputs, so a
version compressed to one would answer bare scores, and every client reading the names
would break on the first request a canary sends it. This backend adds the names from the
version's ``slipway.json`` labels, making every version of a model answer alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from contracts.model_manifest import CLASSES_SUFFIX
from serving.backends.base import Backend
from serving.signature import STRING, Signature, TensorSpec


class ClassNamesBackend:
    """``model`` with ``<head>_classes`` outputs added where its signatures lack them."""

    def __init__(self, model: Backend, class_names: Mapping[str, Sequence[str]]) -> None:
        self._model = model
        self._names = {
            output: np.array([name.encode("utf-8") for name in names], dtype=object)
            for output, names in class_names.items()
        }
        self._added: dict[str, list[str]] = {}
        self.signatures: dict[str, Signature] = {}
        for key, signature in model.signatures.items():
            added = [
                output
                for output in self._names
                if output.removesuffix(CLASSES_SUFFIX) in signature.outputs
                and output not in signature.outputs
            ]
            specs = {
                output: TensorSpec(output, STRING, (-1, len(self._names[output])))
                for output in added
            }
            self._added[key] = added
            self.signatures[key] = Signature(key, signature.inputs, {**signature.outputs, **specs})

    def run(
        self, signature_name: str, inputs: dict[str, np.ndarray], timeout: float | None = None
    ) -> dict[str, np.ndarray]:
        outputs = self._model.run(signature_name, inputs, timeout)
        for output in self._added.get(signature_name, ()):
            rows = len(outputs[output.removesuffix(CLASSES_SUFFIX)])
            outputs[output] = np.tile(self._names[output], (rows, 1))
        return outputs

    def close(self) -> None:
        self._model.close()
