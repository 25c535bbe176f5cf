"""The MLServer runtime that ``benchmarks.serving_peers`` serves the benchmark's SavedModel
with: the smallest custom runtime a user would write for a TensorFlow model, so the figures
are MLServer's own (adaptive batching, V2 REST) around the same TensorFlow call the gateway
makes.

Imported by MLServer in ``.venv-peers`` (``make peers``), never by the project's venv.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class SavedModelRuntime(MLModel):
    """Calls ``serving_default`` of the SavedModel at ``parameters.uri`` on the request's
    inputs, by name. Adaptive batching has already stacked the queued requests' rows into
    one request when ``predict`` runs, and splits the answer back."""

    _function: Any

    async def load(self) -> bool:
        uri = await get_model_uri(self.settings)
        self._function = tf.saved_model.load(uri).signatures["serving_default"]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        inputs = {item.name: tf.constant(NumpyCodec.decode_input(item)) for item in payload.inputs}
        outputs = self._function(**inputs)
        return InferenceResponse(
            model_name=self.name,
            outputs=[
                NumpyCodec.encode_output(name, value.numpy()) for name, value in outputs.items()
            ],
        )
