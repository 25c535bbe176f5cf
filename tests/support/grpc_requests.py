"""PredictRequests for the digits test model, as TensorFlow Serving's clients build them."""

from __future__ import annotations

import numpy as np
from tensorflow_serving.apis import predict_pb2

from serving.tensors import numpy_to_tensor_proto
from tests.support.serving_models import MODEL_NAME, sample_inputs


def predict_request(
    model: str = MODEL_NAME,
    inputs: dict[str, np.ndarray] | None = None,
    *,
    rows: int = 1,
    version: int | None = None,
    label: str | None = None,
    signature: str = "",
) -> predict_pb2.PredictRequest:
    """A request for ``model`` with ``inputs`` (else ``rows`` rows of sample inputs),
    addressed to a version or a label when given."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    if version is not None:
        request.model_spec.version.value = version
    if label is not None:
        request.model_spec.version_label = label
    request.model_spec.signature_name = signature
    for name, array in (inputs or sample_inputs(rows)).items():
        request.inputs[name].CopyFrom(numpy_to_tensor_proto(array))
    return request
